// The reference (Hugging Face tokenizers through its Node binding) behind the same interface as
// `specrun tokenize` / `specrun detokenize`, for comparing any tokenizer.json from outside:
//
//   diff <(specrun tokenize --tokenizer T.json < in.txt) \
//        <(node tools/tokenizer/reference.mjs build/tokenizers tokenize T.json < in.txt)
//
// Usage: node reference.mjs TOKENIZERS_DIR tokenize|detokenize TOKENIZER_JSON
//            [--add-special] [--skip-special] [--json]
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const [root, command, file, ...flags] = process.argv.slice(2);
const require = createRequire(path.resolve(root, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const tok = Tokenizer.fromFile(file);
const input = fs.readFileSync(0);
const lines = [];
let start = 0;
for (let i = 0; i < input.length; i++) {
  if (input[i] === 0x0a) {
    lines.push(input.subarray(start, i));
    start = i + 1;
  }
}
if (start < input.length) lines.push(input.subarray(start));
const out = [];
for (const bytes of lines) {
  const line = bytes.toString('utf8');
  if (command === 'tokenize') {
    const encoding = await tok.encode(line, null, { addSpecialTokens: flags.includes('--add-special') });
    out.push(JSON.stringify(Array.from(encoding.getIds())));
  } else {
    const text = await tok.decode(JSON.parse(line), flags.includes('--skip-special'));
    out.push(flags.includes('--json') ? JSON.stringify(text) : text);
  }
}
process.stdout.write(out.map((l) => l + '\n').join(''));
