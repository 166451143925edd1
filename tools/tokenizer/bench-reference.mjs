// The reference side of tools/tokenizer/bench.sh: Hugging Face tokenizers (through the Node
// binding) encoding a text file as one string and line by line, fastest of REPEATS runs, in the
// JSON shape specrun-tokbench prints. Run it on one core with RAYON_NUM_THREADS=1.
// Usage: node bench-reference.mjs TOKENIZERS_DIR TOKENIZER_JSON INPUT [REPEATS]
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const [root, file, input, repeatsArg] = process.argv.slice(2);
const require = createRequire(path.resolve(root, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const tok = Tokenizer.fromFile(file);
const text = fs.readFileSync(input, 'utf8');
const lines = text.split('\n');
const megabytes = Buffer.byteLength(text) / 1e6;
const repeats = Math.max(1, Number(repeatsArg || 3));
const encode = async (s) => (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
const checksum = (ids, hash) => {
  for (const id of ids) hash = Math.imul(hash ^ id, 16777619) >>> 0;
  return hash;
};

await encode(text.slice(0, 100000));  // warm-up, as on the specrun side
let bestWhole = Infinity;
let bestLines = Infinity;
let whole = null;
let perLine = null;
for (let r = 0; r < repeats; r++) {
  let start = process.hrtime.bigint();
  whole = await encode(text);
  bestWhole = Math.min(bestWhole, Number(process.hrtime.bigint() - start) / 1e9);
  perLine = new Array(lines.length);
  start = process.hrtime.bigint();
  for (let i = 0; i < lines.length; i++) perLine[i] = await encode(lines[i]);
  bestLines = Math.min(bestLines, Number(process.hrtime.bigint() - start) / 1e9);
}
let lineTokens = 0;
let lineSum = 2166136261;
for (const ids of perLine) {
  lineTokens += ids.length;
  lineSum = checksum(ids, lineSum);
}
const print = (shape, seconds, tokens, sum) =>
  console.log(JSON.stringify({ impl: 'reference', shape, mb_per_s: Number((megabytes / seconds).toFixed(3)), tokens, checksum: sum }));
print('whole', bestWhole, whole.length, checksum(whole, 2166136261));
print('lines', bestLines, lineTokens, lineSum);
