"""The metering proxy against a provider that bills like a real one, through the real SDKs.

The provider's bill is the truth: what the proxy recorded equals what was billed, and what was
billed stays within the cap, under concurrency, for streams the client cuts, with an upstream
that fails, and with two proxies sharing one Redis ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ampmeter.analysis import summarize
from ampmeter.local_llm import LocalLLMServer
from ampmeter.proxy import BudgetFileError, MeteringProxy, read_budget_file
from ampmeter.proxy.budget_file import ProxyBudgets, budgets_from
from ampmeter.testing.billing import BillingProvider
from ampmeter.testing.replay import ReplayResponse, ReplayServer
from support.redis_server import RedisServer, redis_server_fixture
from support.wire import chat_stream

__all__ = ["redis_server_fixture"]

PRICES = {"gpt-4o-mini": ("0.15", "0.60"), "claude-haiku-4-5": ("1.00", "5.00")}
PROMPT = [{"role": "user", "content": "Summarise the meeting notes, please. " * 8}]


def budgets(bill: BillingProvider, callers: dict[str, Any], **proxy: Any) -> ProxyBudgets:
    upstreams = {"openai": bill.openai_base_url, "anthropic": bill.url}
    return budgets_from({"proxy": proxy, "upstreams": upstreams, "callers": callers})


def hammer(base_url: str, threads: int, per_thread: int) -> tuple[int, list[openai.APIError]]:
    """Each thread calls (plain and streamed in turn) until refused; (answered, refusals)."""
    client = openai.OpenAI(base_url=base_url, api_key="sk-callers-own-key")
    answered = 0
    refusals: list[openai.APIError] = []
    lock = threading.Lock()

    def worker() -> None:
        nonlocal answered
        for i in range(per_thread):
            try:
                if i % 2:
                    client.chat.completions.create(
                        model="gpt-4o-mini", messages=PROMPT, max_tokens=40
                    )
                else:
                    chunks = list(
                        client.chat.completions.create(
                            model="gpt-4o-mini", messages=PROMPT, max_tokens=40, stream=True
                        )
                    )
                    # the usage event the proxy asked for is not passed on
                    assert all(chunk.choices for chunk in chunks)
            except openai.APIStatusError as refused:
                with lock:
                    refusals.append(refused)
                return
            with lock:
                answered += 1

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for worker_thread in workers:
        worker_thread.start()
    for worker_thread in workers:
        worker_thread.join()
    return answered, refusals


def test_a_shared_cap_holds_under_concurrency_and_the_count_equals_the_bill(
    tmp_path: Path,
) -> None:
    cap = Decimal("0.0005")
    with BillingProvider(prices=PRICES, output_tokens=40) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": float(cap)}}, log_dir=str(tmp_path))
        with MeteringProxy(config) as proxy:
            answered, refusals = hammer(proxy.base_urls()["OPENAI_BASE_URL"], 16, 40)
            stats = proxy.context("team").stats
            recorded = stats.total_cost()
        assert bill.billed_usd <= cap
        assert bill.billed_usd > cap * Decimal("0.9")  # the cap is used, not just held
        assert recorded == bill.billed_usd
        assert answered == len(bill.calls)
    # every thread was refused once, with a provider-shaped 402 the SDK did not retry
    assert len(refusals) == 16
    assert {r.status_code for r in refusals if isinstance(r, openai.APIStatusError)} == {402}
    assert "amp:cost" in str(refusals[0])
    # one JSONL line per request, refusals included (a busy 429 the SDK tried again is one
    # more), without the caller's key
    log = (tmp_path / "team.jsonl").read_text()
    lines = [json.loads(line) for line in log.splitlines()]
    statuses = [line["metadata"]["status"] for line in lines]
    assert statuses.count("success") == answered
    assert statuses.count("halt") >= 16 and len(lines) == answered + statuses.count("halt")
    assert "sk-callers-own-key" not in log


def test_callers_are_named_by_their_proxy_key_and_keep_their_own_budgets() -> None:
    with BillingProvider(prices=PRICES) as bill:
        config = budgets(
            bill,
            {
                "alice": {"key": "alice-key", "limits": {"amp:llm_calls": 2}},
                "bob": {"key": "bob-key", "limits": {"amp:llm_calls": 1}},
            },
        )
        with MeteringProxy(config) as proxy:
            alice = openai.OpenAI(base_url=proxy.base_urls("alice")["OPENAI_BASE_URL"], api_key="a")
            header = openai.OpenAI(
                base_url=f"{proxy.url}/openai",
                api_key="b",
                default_headers={"x-ampmeter-key": "bob-key"},
            )
            stranger = openai.OpenAI(base_url=f"{proxy.url}/openai", api_key="c")
            for _ in range(2):
                alice.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
            with pytest.raises(openai.APIStatusError) as stopped:
                alice.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
            assert stopped.value.status_code == 402
            header.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
            with pytest.raises(openai.AuthenticationError, match="no caller has that proxy key"):
                stranger.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
            assert proxy.context("alice").stats.get_counter("amp:llm_calls") == 2
            assert proxy.context("bob").stats.get_counter("amp:llm_calls") == 1
        assert len(bill.calls) == 3  # the refused and the unknown caller's never went upstream


def test_anthropic_plain_and_streamed_through_the_proxy() -> None:
    with BillingProvider(prices=PRICES, output_tokens=12) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": 1.0}})
        with MeteringProxy(config) as proxy:
            client = anthropic.Anthropic(
                base_url=proxy.base_urls()["ANTHROPIC_BASE_URL"], api_key="sk-ant"
            )
            client.messages.create(model="claude-haiku-4-5", max_tokens=50, messages=PROMPT)
            with client.messages.stream(
                model="claude-haiku-4-5", max_tokens=50, messages=PROMPT
            ) as stream:
                text = "".join(stream.text_stream)
            assert text
            stats = proxy.context("team").stats
            assert stats.total_cost() == bill.billed_usd > 0
            assert stats.get_counter("amp:input_tokens") == bill.billed_input_tokens


def test_a_stream_the_client_cuts_is_read_to_its_end_and_charged_exactly() -> None:
    with BillingProvider(prices=PRICES, output_tokens=200) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": 1.0}})
        with MeteringProxy(config) as proxy:
            base = proxy.base_urls()["OPENAI_BASE_URL"]
            body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": True}
            with (
                httpx.Client() as http,
                http.stream("POST", f"{base}/chat/completions", json=body) as response,
            ):
                assert response.status_code == 200
                next(response.iter_raw())  # the first piece, then the client hangs up
            deadline = time.monotonic() + 10
            stats = proxy.context("team").stats
            while stats.total_cost() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(bill.calls) == 1
            # the provider billed the whole answer; its usage, read after the client left, says so
            assert stats.total_cost() == bill.billed_usd > 0


def test_an_upstream_that_cannot_be_reached_is_a_provider_shaped_502() -> None:
    with BillingProvider(prices=PRICES) as bill:
        dead = budgets_from(
            {
                "upstreams": {"openai": "http://127.0.0.1:9/v1", "anthropic": bill.url},
                "callers": {"team": {"max_cost_usd": 1.0}},
            }
        )
        with MeteringProxy(dead) as proxy:
            client = openai.OpenAI(
                base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="k", max_retries=0
            )
            with pytest.raises(openai.APIStatusError, match="upstream could not be reached") as e:
                client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
            assert e.value.status_code == 502
            stats = proxy.context("team").stats
            assert stats.total_cost() == 0  # nothing reached a provider
            assert proxy.context("team").graph.aggregates()["total_llm_calls"] == 1


def test_a_request_it_cannot_estimate_is_refused_unless_allowed() -> None:
    with BillingProvider(prices=PRICES) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": 1.0}})
        with MeteringProxy(config) as proxy, httpx.Client() as http:
            base = proxy.base_urls()["OPENAI_BASE_URL"]
            speech = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}
            refused = http.post(f"{base}/audio/speech", json=speech)
            assert refused.status_code == 400
            assert "cannot estimate" in refused.json()["error"]["message"]
            no_model = http.post(f"{base}/chat/completions", json={"messages": PROMPT})
            assert no_model.status_code == 400
            # A batch is no model call, whatever model its body names (docs: "Batches").
            batch = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions"}
            batch_named = http.post(f"{base}/batches", json={**batch, "model": "gpt-4o-mini"})
            assert batch_named.status_code == 400
        assert bill.requests == []
        with (
            MeteringProxy(config, allow_unestimated=True) as proxy,
            httpx.Client() as http,
        ):
            base = proxy.base_urls()["OPENAI_BASE_URL"]
            forwarded = http.post(f"{base}/audio/speech", json=speech)
            assert forwarded.status_code == 404  # the provider's own answer: it went upstream
        assert len(bill.requests) == 1


def test_two_proxies_share_one_cap_through_redis(redis_server: RedisServer) -> None:
    cap = Decimal("0.0004")
    with BillingProvider(prices=PRICES, output_tokens=40) as bill:
        scope = f"proxy-test-{time.time_ns()}"
        config = budgets(
            bill, {"team": {"scope": scope, "max_cost_usd": float(cap)}}, ledger=redis_server.url
        )
        with MeteringProxy(config) as first, MeteringProxy(config) as second:
            results: list[tuple[int, list[openai.APIError]]] = []
            runs = [
                threading.Thread(
                    target=lambda p=p: results.append(
                        hammer(p.base_urls()["OPENAI_BASE_URL"], 8, 30)
                    )
                )
                for p in (first, second)
            ]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
            recorded = first.context("team").stats.total_cost()
            recorded += second.context("team").stats.total_cost()
        assert bill.billed_usd <= cap
        assert bill.billed_usd > cap * Decimal("0.8")
        assert recorded == bill.billed_usd


def test_budget_file_mistakes_name_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "budgets.toml"
    path.write_text('[callers.team]\nmax_cost_usd = "five"\n')
    with pytest.raises(BudgetFileError, match=r"budgets.toml: \[callers.team\] max_cost_usd"):
        read_budget_file(path)
    path.write_text("[callers.team]\nmax_cost = 5\n")
    with pytest.raises(BudgetFileError, match="has no key 'max_cost'"):
        read_budget_file(path)
    path.write_text('[callers.a]\nkey = "k"\n[callers.b]\nkey = "k"\n')
    with pytest.raises(BudgetFileError, match="two callers share one key"):
        read_budget_file(path)
    path.write_text('[upstreams]\nopenai = "file:///etc/passwd"\n')
    with pytest.raises(BudgetFileError, match="must be an http"):
        read_budget_file(path)
    path.write_text("[callers.team\n")
    with pytest.raises(BudgetFileError, match="is not valid TOML"):
        read_budget_file(path)
    with pytest.raises(BudgetFileError, match="cannot read the budget file"):
        read_budget_file(tmp_path / "missing.toml")


def test_the_proxy_command_serves_until_interrupted_and_keeps_its_log(tmp_path: Path) -> None:
    with BillingProvider(prices=PRICES) as bill:
        path = tmp_path / "budgets.toml"
        path.write_text(
            f'[proxy]\nlog_dir = "{tmp_path / "logs"}"\n'
            f'[upstreams]\nopenai = "{bill.openai_base_url}"\n'
            '[callers.team]\nkey = "team-secret"\nmax_cost_usd = 1.0\n'
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "ampmeter", "proxy", "--budget-file", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first.startswith("ampmeter proxy: listening on http://127.0.0.1:"), first
            url = first.split()[-1]
            client = openai.OpenAI(base_url=f"{url}/k/team-secret/openai", api_key="sk-own")
            client.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
        finally:
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        log = (tmp_path / "logs" / "team.jsonl").read_text()
        assert len(log.splitlines()) == 1
        assert "team-secret" not in out + err + log
        assert "sk-own" not in out + err + log


def test_responses_embeddings_and_images_through_the_proxy(tmp_path: Path) -> None:
    """The Responses API (plain, streamed, and continuing a stored response, whose stored
    input is billed again), embeddings and image generation (once refused as a request the
    proxy could not estimate) are metered like chat: recorded equals billed."""
    with BillingProvider(prices=PRICES, output_tokens=20) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": 1.0}}, log_dir=str(tmp_path))
        with MeteringProxy(config) as proxy:
            client = openai.OpenAI(base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="k")
            first = client.responses.create(model="gpt-4o-mini", input="Plan the week. " * 8)
            later = client.responses.create(
                model="gpt-4o-mini", input="And the weekend?", previous_response_id=first.id
            )
            events = client.responses.create(
                model="gpt-4o-mini", input="Say more.", previous_response_id=later.id, stream=True
            )
            assert [e.type for e in events][-1] == "response.completed"
            assert proxy.context("team").stats.total_cost() == bill.billed_usd > 0
    embedding = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }
    usage = {"input_tokens": 50, "output_tokens": 4160, "total_tokens": 4210}
    image = {"created": 1, "data": [{"b64_json": "aW1hZ2U="}], "usage": usage}
    with ReplayServer() as replay:
        replay.script("/v1/embeddings", ReplayResponse.json(embedding))
        replay.script("/v1/images/generations", ReplayResponse.json(image))
        config = budgets_from(
            {"upstreams": {"openai": replay.openai_base_url}, "callers": {"team": {}}}
        )
        with MeteringProxy(config) as proxy:
            client = openai.OpenAI(base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="k")
            made = client.embeddings.create(model="text-embedding-3-small", input="a cat")
            assert made.data[0].embedding == [0.25, -0.5]
            assert proxy.context("team").stats.get_counter("amp:input_tokens") == 8
            client.images.generate(model="gpt-image-1", prompt="A boat")
            # 50 input tokens at $5 a million, 4,160 image tokens at $40 a million, and the
            # embedding's 8 tokens at $0.02 a million
            cost = Decimal("0.16665") + Decimal("0.00000016")
            assert proxy.context("team").stats.total_cost() == cost
    # what the proxy logged reads as one run named after its caller
    (run,) = summarize([tmp_path / "team.jsonl"]).runs
    assert run.name == "team" and run.llm_sent == 3 and run.termination == "success"


_CLIENT_PROCESS = """
import sys, threading, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-own", max_retries=0)
answered = refused = 0
lock = threading.Lock()
def work():
    global answered, refused
    for _ in range(20):
        try:
            client.chat.completions.create(
                model="gpt-4o-mini", max_tokens=40,
                messages=[{"role": "user", "content": "Summarise the notes, please. " * 8}],
            )
        except openai.APIStatusError as error:
            if error.response.headers.get("retry-after"):
                continue  # busy: other calls' holds
            with lock:
                refused += 1
            return
        with lock:
            answered += 1
threads = [threading.Thread(target=work) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(answered, refused)
"""


def test_64_concurrent_requests_from_four_processes_hold_one_cap(tmp_path: Path) -> None:
    cap = Decimal("0.001")
    script = tmp_path / "client.py"
    script.write_text(_CLIENT_PROCESS)
    with BillingProvider(prices=PRICES, output_tokens=40) as bill:
        config = budgets(bill, {"team": {"max_cost_usd": float(cap)}})
        with MeteringProxy(config) as proxy:
            base = proxy.base_urls()["OPENAI_BASE_URL"]
            processes = [
                subprocess.Popen(
                    [sys.executable, str(script), base], stdout=subprocess.PIPE, text=True
                )
                for _ in range(4)
            ]
            outputs = [p.communicate(timeout=120)[0].split() for p in processes]
            recorded = proxy.context("team").stats.total_cost()
        assert all(p.returncode == 0 for p in processes)
        answered = sum(int(out[0]) for out in outputs)
        assert sum(int(out[1]) for out in outputs) == 64  # every client thread was stopped
        assert answered == len(bill.calls) > 0
        assert recorded == bill.billed_usd <= cap
        assert bill.billed_usd > cap * Decimal("0.9")


def test_the_local_model_through_the_proxy(llm_server: LocalLLMServer) -> None:
    """A real llama.cpp server as the upstream: what it reports is what the proxy counts, and
    an unpriced model under no cost limit is let through and logged as unpriced."""
    config = budgets_from(
        {
            "upstreams": {"openai": llm_server.base_url},
            "callers": {"team": {"limits": {"amp:llm_calls": 1}}},
        }
    )
    with MeteringProxy(config) as proxy:
        client = openai.OpenAI(base_url=proxy.base_urls()["OPENAI_BASE_URL"], api_key="local")
        answer = client.chat.completions.create(
            model=llm_server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        with pytest.raises(openai.APIStatusError) as stopped:
            client.chat.completions.create(
                model=llm_server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8
            )
        stats = proxy.context("team").stats
    assert stopped.value.status_code == 402
    assert answer.usage is not None
    assert stats.get_counter("amp:input_tokens") == answer.usage.prompt_tokens
    assert stats.get_counter("amp:output_tokens") == answer.usage.completion_tokens


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole body"])
def test_a_body_the_reader_cannot_take_passes_the_proxy_whole_and_is_charged(stream: bool) -> None:
    """Through the metering proxy the reader's error stopped the relay mid-body: the client got
    a cut answer and the call, billed upstream, was left open instead of charged."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 10}
    chunk = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "choices": 5}
    whole = {"id": "chatcmpl-1", "object": "chat.completion", "choices": 5, "usage": usage}
    body = {"model": "gpt-4o-mini", "messages": PROMPT, "stream": stream}
    with ReplayServer() as replay:
        replay.script(
            "/v1/chat/completions",
            chat_stream(chunk, usage) if stream else ReplayResponse.json(whole),
        )
        upstreams = {"openai": replay.openai_base_url, "anthropic": replay.url}
        callers = {"team": {"max_cost_usd": 1.0}}
        with MeteringProxy(budgets_from({"upstreams": upstreams, "callers": callers})) as proxy:
            url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
            got = httpx.post(url, json=body, headers={"Authorization": "Bearer k"}).content
            stats = proxy.context("team").stats
            assert stats.get_counter("amp:input_tokens") == 1000
            (node,) = [n for n in proxy.context("team").graph.nodes() if n.kind == "llm"]
    # (The usage event the proxy asked for is hidden from a client that did not.)
    assert b'"choices":5' in got.replace(b" ", b"")
    assert got.endswith(b"data: [DONE]\n\n") if stream else json.loads(got)["usage"] == usage
    assert (node.status, node.error_class, node.tokens_out) == ("fail", "TypeError", 10)


def test_an_upstream_redirect_goes_back_to_the_caller_and_the_key_stays_home() -> None:
    """The proxy followed an upstream's redirect itself, sending the caller's request, key
    headers included, to whatever host the redirect named. A redirect now goes back to the
    caller as it came (its client decides), and costs nothing: no provider answered it."""
    body = {"model": "gpt-4o-mini", "messages": PROMPT}
    with ReplayServer() as elsewhere, ReplayServer() as replay:
        where = elsewhere.openai_base_url + "/chat/completions"
        replay.script(
            "/v1/chat/completions", ReplayResponse.json({}, status=307, headers={"location": where})
        )
        upstreams = {"openai": replay.openai_base_url, "anthropic": replay.url}
        callers = {"team": {"max_cost_usd": 1.0}}
        with MeteringProxy(budgets_from({"upstreams": upstreams, "callers": callers})) as proxy:
            url = proxy.base_urls()["OPENAI_BASE_URL"] + "/chat/completions"
            answer = httpx.post(url, json=body, headers={"x-api-key": "secret"})
            stats = proxy.context("team").stats
            assert stats.total_cost() == 0
            (node,) = [n for n in proxy.context("team").graph.nodes() if n.kind == "llm"]
        assert elsewhere.requests == []
    assert (answer.status_code, answer.headers["location"]) == (307, where)
    assert node.status == "fail"
