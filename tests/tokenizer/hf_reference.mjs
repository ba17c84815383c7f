// The reference side of the tokenizer parity test: Hugging Face tokenizers (the Rust library, through the
// @anush008/tokenizers Node binding) on a tokenizer.json.
//
// usage: node hf_reference.mjs NPM_DIR TOKENIZER_JSON [--decode] < strings.jsonl > ids.jsonl
//   NPM_DIR         folder where `npm install --prefix NPM_DIR @anush008/tokenizers` was run
//   stdin           one JSON string per line
//   stdout          one JSON array of ids per line (add_special_tokens=false: no BOS/EOS templates; special
//                   tokens written in the text still map to their ids, as HF always does);
//                   with --decode: [ids, decode(ids), decode(ids without the first token)] per line, the
//                   last one exercising HF's replacement of broken UTF-8 sequences;
//                   with --pretokens: the pre-tokenizer's pieces (byte-level text) of each string as given
//                   (no normalizer, no added-token matching).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

const [npmDir, tokenizerJson, ...flags] = process.argv.slice(2);
if (!npmDir || !tokenizerJson) {
  process.stderr.write('usage: node hf_reference.mjs NPM_DIR TOKENIZER_JSON [--decode] < in.jsonl\n');
  process.exit(2);
}
const withDecode = flags.includes('--decode');
const preTokens = flags.includes('--pretokens');
const require = createRequire(resolve(npmDir, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const tokenizer = Tokenizer.fromFile(tokenizerJson);

const lines = readFileSync(0, 'utf8').split('\n').filter((l) => l.length > 0);
const texts = lines.map((l, i) => {
  const v = JSON.parse(l);
  if (typeof v !== 'string') throw new Error(`stdin line ${i + 1}: not a JSON string`);
  return v;
});

const out = [];
if (preTokens) {
  const pre = tokenizer.getPreTokenizer();
  for (const t of texts) out.push(JSON.stringify(pre.preTokenizeString(t).map((p) => p[0])));
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
  process.exit(0);
}
const kBatch = 512;
for (let b = 0; b < texts.length; b += kBatch) {
  const encodings = await tokenizer.encodeBatch(texts.slice(b, b + kBatch), { addSpecialTokens: false });
  const ids = encodings.map((e) => Array.from(e.getIds()));
  if (!withDecode) {
    for (const x of ids) out.push(JSON.stringify(x));
    continue;
  }
  const full = await tokenizer.decodeBatch(ids, false);
  const tails = await tokenizer.decodeBatch(ids.map((x) => x.slice(1)), false);
  for (let i = 0; i < ids.length; ++i) out.push(JSON.stringify([ids[i], full[i], tails[i]]));
}
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
