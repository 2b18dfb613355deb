"""The optional offline tokenizer (ampmeter[tokenizer]) sharpens OpenAI models' estimates."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.pricing import request_size, tokenizer
from ampmeter.pricing.request_size import input_tokens, learn, measure

bpe_openai = pytest.importorskip("bpe_openai")

DENSE = "字" * 400
PROSE = "The quarterly report shows revenue up four percent on strong demand in Europe. " * 10


@pytest.fixture(autouse=True)
def _tokenizer_on() -> Iterator[None]:
    request_size.forget()
    tokenizer.use()
    yield
    tokenizer.use(False)
    request_size.forget()


def o200k(text: str) -> int:
    return len(bpe_openai.get_encoding("o200k_base").encode(text, disallowed_special=()))


def chat(text: str, model: str = "gpt-4o") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("openai/gpt-4.1-nano", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-sonnet-4-5", None),
        ("gpt-4origami", None),
    ],
)
def test_encodings_by_model_family(model: str, encoding: str | None) -> None:
    assert tokenizer.encoding_name(model) == encoding


def test_dense_text_is_counted_exactly_before_any_call() -> None:
    size = measure("chat", chat(DENSE))
    assert size.text_tokens == o200k(DENSE)
    estimate = input_tokens(size, "gpt-4o")
    assert estimate == o200k(DENSE) + 3 + 3  # the text, one message, the reply's priming
    tokenizer.use(False)
    by_chars = input_tokens(measure("chat", chat(DENSE)), "gpt-4o")
    assert by_chars == 400 + 6  # the prior, a token a character: not under the real count
    assert by_chars >= estimate


def test_learning_corrects_the_count_by_a_bounded_step() -> None:
    size = measure("chat", chat(PROSE))
    assert size.text_tokens == o200k(PROSE)
    learn("gpt-4o", size, size.text_tokens + size.framing)  # billed as counted: no change
    assert input_tokens(size, "gpt-4o") == size.text_tokens + size.framing
    learn("gpt-4o", size, size.framing + size.text_tokens * 6 // 10)  # billed 40% less
    assert input_tokens(size, "gpt-4o") == -(-size.text_tokens * 4 // 5) + size.framing  # /1.25


def test_other_families_and_switching_off_count_characters() -> None:
    assert measure("anthropic", {"model": "claude-sonnet-4-5", "messages": []}).text_tokens is None
    tokenizer.use(False)
    assert not tokenizer.in_use()
    assert measure("chat", chat(PROSE)).text_tokens is None


def test_use_names_the_extra_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer.use(False)
    monkeypatch.setattr(tokenizer, "available", lambda: False)
    with pytest.raises(ImportError, match=r"ampmeter\[tokenizer\]"):
        tokenizer.use()
    assert not tokenizer.in_use()


texts = st.text(
    st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc")), max_size=200
)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(texts, min_size=1, max_size=5),
    encoding=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_the_bound_is_never_below_a_real_tokenizer(parts: list[str], encoding: str) -> None:
    """OpenAI's own encodings never count more tokens than the bound: bytes plus framing."""
    tokenizer.use(False)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": p} for p in parts]}
    size = measure("chat", body)
    enc = bpe_openai.get_encoding(encoding)
    counted = sum(len(enc.encode(p, disallowed_special=())) for p in parts)
    # The cookbook's framing: 3 a message and 3 for the reply.
    assert counted + 3 * len(parts) + 3 <= input_tokens(size, "gpt-4o", "bound")


def test_the_bound_counts_with_the_models_own_encoding() -> None:
    """With the tokenizer on, ``bound`` reserves each message's tokens in the model's encoding
    plus the framing: the exact count, about a quarter of one token per byte for prose."""
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": PROSE},
            {"role": "user", "content": DENSE},
        ],
    }
    bound = input_tokens(measure("chat", body), "gpt-4o", "bound")
    assert bound == o200k(PROSE) + o200k(DENSE) + 3 * 2 + 3
    tokenizer.use(False)
    by_bytes = input_tokens(measure("chat", body), "gpt-4o", "bound")
    assert by_bytes > 2 * bound


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(texts, min_size=1, max_size=5))
def test_the_tokenizer_bound_is_never_below_the_encoding(parts: list[str]) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": p} for p in parts]}
    counted = sum(o200k(p) for p in parts)
    assert counted + 3 * len(parts) + 3 <= input_tokens(measure("chat", body), "gpt-4o", "bound")


def test_a_models_counter_is_resolved_once_and_again_after_use_switches() -> None:
    """A request's counter is looked up, not worked out, once its model was met: the family's
    prefix match runs once per model; switching the tokenizer off and on resolves it anew."""
    resolved: list[str] = []
    original = tokenizer.encoding_name

    def spy(model: str) -> str | None:
        resolved.append(model)
        return original(model)

    tokenizer.use()  # (forgets what was resolved before this test)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokenizer, "encoding_name", spy)
        first = measure("chat", chat(PROSE, model="gpt-4o-2024-08-06"))
        again = measure("chat", chat(PROSE, model="gpt-4o-2024-08-06"))
        assert resolved == ["gpt-4o-2024-08-06"] and first == again
        assert first.text_tokens == o200k(PROSE)
        tokenizer.use(False)
        assert measure("chat", chat(PROSE, model="gpt-4o-2024-08-06")).text_tokens is None
        tokenizer.use()
        assert measure("chat", chat(PROSE, model="gpt-4o-2024-08-06")) == first
    assert resolved == ["gpt-4o-2024-08-06"] * 2
