// Live comparison input: writes COUNT random strings (seeded; SPECRUN_LIVE_SEED overrides the
// seed) with the reference's encode ids and decode text, one JSON object per line:
//   {"text": ..., "ids": [...], "decoded": ...}
// Usage: node live-sample.mjs TOKENIZERS_DIR TOKENIZER_JSON COUNT [SEED]
import { createRequire } from 'module';
import path from 'path';

const [root, file, countArg, seedArg] = process.argv.slice(2);
const require = createRequire(path.resolve(root, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const tok = Tokenizer.fromFile(file);
let seed = Number(process.env.SPECRUN_LIVE_SEED || seedArg || 1) | 0;
const random = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (list) => list[Math.floor(random() * list.length)];
const RANGES = [[0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0xa0, 0x24f], [0x300, 0x36f],
  [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f],
  [0x1100, 0x11ff], [0x2000, 0x206f], [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
  [0xff00, 0xffef], [0x1d400, 0x1d7ff], [0x1f300, 0x1faff]];
const PIECES = [' ', '  ', '\t', '\r', '\n', '\n\n', ' \n ', '\u00a0', '\u3000', '\u0085',
  '\u200d', '\ufe0f', "'s", "'T", "'re", "'LL", "'d", '1234', '3.14', 'the', ' the', 'The',
  'ing', '<s>', '</s>', '<unk>', '<|begin_of_text|>', '<|eot_id|>', '<|endoftext|>',
  '<|im_start|>', '<|im_end|>', '<think>', '</think>', '\u2581', '\u0120', 'e\u0301',
  '\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67', '\ud83d\udc4d\ud83c\udffd', '...', '!!', '->',
  '::', '{}', '()', '0x1F', '    ', '\t\t'];
const count = Number(countArg || 100);
for (let n = 0; n < count; n++) {
  let text = '';
  const parts = 1 + Math.floor(random() * 24);
  for (let p = 0; p < parts; p++) {
    if (random() < 0.4) {
      text += pick(PIECES);
    } else {
      const [lo, hi] = pick(RANGES);
      const run = 1 + Math.floor(random() * 6);
      for (let k = 0; k < run; k++) text += String.fromCodePoint(lo + Math.floor(random() * (hi - lo + 1)));
    }
  }
  const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
  const decoded = await tok.decode(ids, false);
  console.log(JSON.stringify({ text, ids, decoded }));
}
