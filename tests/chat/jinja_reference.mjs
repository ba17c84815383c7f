// The reference side of the Jinja parity test: @huggingface/jinja (the engine transformers.js renders chat
// templates with) on one template and a batch of contexts.
//
// usage: node jinja_reference.mjs NPM_DIR < batch.json > results.jsonl
//   NPM_DIR   folder where `npm install --prefix NPM_DIR @huggingface/jinja` was run
//   stdin     {"template": "...", "contexts": [{...}, ...]}, or {"cases": [{"template": "...", "context": {...}}]}
//   stdout    one line per context (per case): {"ok": true, "text": "..."} or {"ok": false, "error": "..."}; a
//             template that does not parse gives {"ok": false, "error": "parse: ..."}
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

const [npmDir] = process.argv.slice(2);
if (!npmDir) {
  process.stderr.write('usage: node jinja_reference.mjs NPM_DIR < batch.json\n');
  process.exit(2);
}
const require = createRequire(resolve(npmDir, 'package.json'));
const { Template } = require('@huggingface/jinja');

const batch = JSON.parse(readFileSync(0, 'utf8'));
const render = (source, context) => {
  let t;
  try {
    t = new Template(source);
  } catch (e) {
    return { ok: false, error: `parse: ${e && e.message}` };
  }
  try {
    return { ok: true, text: t.render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message) };
  }
};
if (batch.cases) {
  const lines = batch.cases.map((c) => JSON.stringify(render(c.template, c.context)));
  process.stdout.write(lines.join('\n') + (lines.length ? '\n' : ''));
  process.exit(0);
}
let template = null;
let parseError = null;
try {
  template = new Template(batch.template);
} catch (e) {
  parseError = `parse: ${e && e.message}`;
}
const out = [];
for (const context of batch.contexts) {
  if (parseError) {
    out.push(JSON.stringify({ ok: false, error: parseError }));
    continue;
  }
  try {
    out.push(JSON.stringify({ ok: true, text: template.render(context) }));
  } catch (e) {
    out.push(JSON.stringify({ ok: false, error: String(e && e.message) }));
  }
}
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
