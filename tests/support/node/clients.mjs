// Calls the provider APIs through ampmeter's proxy with the official Node SDKs, as an agent in
// another language would: the base URLs come from the environment (OPENAI_BASE_URL,
// ANTHROPIC_BASE_URL), nothing here knows about ampmeter. Prints one JSON line per request:
// {"sdk", "kind", "ok", "status", "message"}; a refusal is the SDK's own API error.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const openai = new OpenAI({ apiKey: "sk-node-own-key" });
const anthropic = new Anthropic({ apiKey: "sk-ant-node-own-key" });
const messages = [{ role: "user", content: "Summarise the meeting notes, please. ".repeat(8) }];
const rounds = Number(process.argv[2] ?? "1");

async function attempt(sdk, kind, job) {
  try {
    await job();
    console.log(JSON.stringify({ sdk, kind, ok: true }));
  } catch (error) {
    console.log(JSON.stringify({ sdk, kind, ok: false, status: error.status ?? null, message: String(error.message) }));
  }
}

for (let round = 0; round < rounds; round++) {
  await attempt("openai", "plain", () =>
    openai.chat.completions.create({ model: "gpt-4o-mini", messages, max_tokens: 40 }));
  await attempt("openai", "stream", async () => {
    const stream = await openai.chat.completions.create({ model: "gpt-4o-mini", messages, max_tokens: 40, stream: true });
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) throw new Error("the proxy passed on a usage event nobody asked for");
    }
  });
  await attempt("anthropic", "plain", () =>
    anthropic.messages.create({ model: "claude-haiku-4-5", max_tokens: 40, messages }));
  await attempt("anthropic", "stream", async () => {
    const stream = anthropic.messages.stream({ model: "claude-haiku-4-5", max_tokens: 40, messages });
    await stream.finalMessage();
  });
}
