// The official SDKs against `magnetar serve` (tests/server/sdk_test.cpp runs this): chat, streaming and a tool
// round trip through the openai (chat completions and responses) and @anthropic-ai/sdk npm packages (pinned in
// tests/server/sdk_test.cpp).
//
// usage: node sdk_clients.mjs NPM_DIR PORT > result.json
//   prints one JSON object with what each step got; the C++ test asserts on it.
import { createRequire } from 'node:module';
import { resolve } from 'node:path';

const [npmDir, port] = process.argv.slice(2);
const require = createRequire(resolve(npmDir, 'package.json'));
const OpenAI = require('openai').default ?? require('openai');
const AnthropicModule = require('@anthropic-ai/sdk');
const Anthropic = AnthropicModule.default ?? AnthropicModule;

const base = `http://127.0.0.1:${port}`;
const out = {};
const weather = {
  name: 'get_weather',
  description: 'Get the current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
{
  const r = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'Who are you?' }], temperature: 0, max_tokens: 30 });
  out.openai_chat = { content: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
  let text = '';
  const stream = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'Who are you?' }], temperature: 0, max_tokens: 30, stream: true });
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  out.openai_stream = text;
  // A forced call through the SDK's stream helper, then the result sent back.
  const runner = openai.chat.completions.stream({
    model: 'm', messages: question, temperature: 0, max_tokens: 120,
    tools: [{ type: 'function', function: weather }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const called = await runner.finalChatCompletion();
  const message = called.choices[0].message;
  out.openai_call = { finish: called.choices[0].finish_reason, tool_calls: message.tool_calls };
  const answer = await openai.chat.completions.create({
    model: 'm', temperature: 0, max_tokens: 30, tools: [{ type: 'function', function: weather }],
    messages: [...question, message, { role: 'tool', tool_call_id: message.tool_calls[0].id, content: '21 degrees' }] });
  out.openai_answer = { content: answer.choices[0].message.content, finish: answer.choices[0].finish_reason };
}

// The Responses API (Codex's): plain, through the SDK's stream helper (which rebuilds the response from the events and
// fails on events out of order), a forced call and its output sent back with the items the call returned.
{
  const ask = { model: 'm', input: 'Who are you?', temperature: 0, max_output_tokens: 30 };
  const r = await openai.responses.create(ask);
  out.responses_plain = { text: r.output_text, status: r.status, usage: r.usage };
  const streamed = await openai.responses.stream(ask).finalResponse();
  out.responses_stream = { text: streamed.output_text, status: streamed.status };
  const tools = [{ type: 'function', ...weather }];
  const called = await openai.responses.stream({
    model: 'm', input: question, temperature: 0, max_output_tokens: 120, tools,
    tool_choice: { type: 'function', name: 'get_weather' } }).finalResponse();
  const call = called.output.find((item) => item.type === 'function_call');
  out.responses_call = { status: called.status, types: called.output.map((item) => item.type), call };
  const answer = await openai.responses.create({
    model: 'm', temperature: 0, max_output_tokens: 30, tools,
    input: [...question, ...called.output, { type: 'function_call_output', call_id: call.call_id, output: '21 degrees' }] });
  out.responses_answer = { text: answer.output_text, status: answer.status };
}

const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
{
  const tool = { name: weather.name, description: weather.description, input_schema: weather.parameters };
  const r = await anthropic.messages.create({
    model: 'm', max_tokens: 30, temperature: 0, messages: [{ role: 'user', content: 'Who are you?' }] });
  out.anthropic_chat = { content: r.content, stop: r.stop_reason };
  const streamed = await anthropic.messages.stream({
    model: 'm', max_tokens: 30, temperature: 0, messages: [{ role: 'user', content: 'Who are you?' }] }).finalMessage();
  out.anthropic_stream = { content: streamed.content, stop: streamed.stop_reason };
  const called = await anthropic.messages.stream({
    model: 'm', max_tokens: 120, temperature: 0, messages: question, tools: [tool],
    tool_choice: { type: 'tool', name: 'get_weather' } }).finalMessage();
  out.anthropic_call = { content: called.content, stop: called.stop_reason };
  const use = called.content.find((b) => b.type === 'tool_use');
  const answer = await anthropic.messages.create({
    model: 'm', max_tokens: 30, temperature: 0, tools: [tool],
    messages: [...question, { role: 'assistant', content: called.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 degrees' }] }] });
  out.anthropic_answer = { content: answer.content, stop: answer.stop_reason };
}
process.stdout.write(JSON.stringify(out) + '\n');
