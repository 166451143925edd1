#!/usr/bin/env python3
"""Writes the tokenizer conformance corpus, tests/data/tokenizer/corpus.txt.

One test case per line (split on b"\\n" only, so a line may hold \\r, tabs, form feeds and
other separators). The categories follow the tokenizer issue: prose, source code, whitespace
runs and tabs, digits and long numbers, CJK, emoji and ZWJ sequences, combining marks, RTL text,
special-token strings inside text, very long words, empty lines, and invalid UTF-8. Everything
is deterministic, so re-running it rewrites the same bytes.

Usage: tools/tokenizer/make_corpus.py [OUT]   (default: tests/data/tokenizer/corpus.txt)
"""
import pathlib
import random
import sys

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "Speculative decoding lets a small draft model propose tokens that a large model verifies.",
    "\"Hello,\" she said, 'how are you?' -- and then: \u201cfine, thanks\u201d.",
    "Don't stop. I'm here, you're there, they've gone, we'll see, she'd know, it's late.",
    "DON'T SHOUT! I'M SERIOUS. YOU'RE LATE, THEY'VE LEFT, WE'LL WAIT, SHE'D CALL, IT'S OK.",
    "Mixed case contractions: 'S 'T 'Re 'vE 'M 'Ll 'D and 'x 'Q, plus a long s: '\u017f.",
    "Dr. Smith (Ph.D., M.D.) arrived at 3 p.m. on Jan. 5th -- e.g., i.e., etc.",
    "Wait... what?! No way!!! Really??? Yes -- really; absolutely (100%).",
    "Email me at someone@example.com or visit https://example.org/path?query=1&x=y#frag.",
    "The caf\u00e9 served cr\u00e8me br\u00fbl\u00e9e and a na\u00efve pi\u00f1a colada.",
    "Sentence one.Sentence two!Sentence three?No spaces after punctuation.",
    "  Leading spaces, and trailing ones  ",
    " a single leading space",
    "Hyphenated-words, em\u2014dashes, en\u2013dashes and ellipses\u2026 all appear.",
    "Quotes: \u2018single\u2019, \u201cdouble\u201d, \u00abguillemets\u00bb, \u201elow\u201c.",
    "Once upon a time, in a land far away, there lived a tokenizer who loved bytes.",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS #@!",
    "lowercase only sentence without any punctuation at all",
    "Title Case Words Appear Here In Sequence",
    "Ce n'est pas une pipe; l'homme qu'il voit aujourd'hui.",
    "Stra\u00dfe, Gr\u00fc\u00dfe, \u00c4pfel und \u00d6l kosten 5 \u20ac.",
    "\u00bfD\u00f3nde est\u00e1 la biblioteca? \u00a1Aqu\u00ed!",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5, \u03a3\u03a3\u03a3 \u03c3\u03c2.",
    "Istanbul \u0130stanbul \u0131\u0131 \u0130I",
]

CODE = [
    "#include <vector>",
    "int main(int argc, char** argv) { return argc > 1 ? 0 : 1; }",
    "    for (size_t i = 0; i < n; ++i) sum += a[i] * b[i];",
    "\tif (x != nullptr && *x >= 0x7fffffff) {",
    "\t\treturn std::make_unique<Tokenizer>(std::move(model));",
    "def fibonacci(n: int) -> int:",
    "    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "        print(f\"{name!r:>10} = {value:.3f}\")  # formatted",
    "const add = (a, b) => a + b; // arrow function",
    "let xs: Vec<u32> = (0..10).map(|x| x * x).collect::<Vec<_>>();",
    "fn main() -> Result<(), Box<dyn std::error::Error>> { Ok(()) }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<div class=\"container\"><p id='x'>Hello &amp; welcome</p></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "if [[ -f \"$HOME/.bashrc\" ]]; then source ~/.bashrc; fi 2>&1 | tee /dev/null",
    "x=$((a+b)); echo \"${x}\" && ls -la | grep -v '^d' > out.txt",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "    }",
    "}",
    "/* multi-line comment start",
    " * continued with a star",
    " */",
    "std::cout << \"tab\\there\" << std::endl;",
    "@decorator(arg=1)\nclass Foo(Bar, metaclass=Meta):",
    "    pass\r",
    "print('windows line ending')\r",
    "key: value\n  - item one\n  - item two",
    "#!/usr/bin/env python3",
    "import numpy as np; np.random.seed(0); x = np.zeros((3, 4), dtype=np.float32)",
    "__init__ __main__ _private __dunder__ snake_case_name CamelCaseName kebab-case-name",
]

WHITESPACE = [
    "a b  c   d    e     f      g",
    "\t",
    "\t\t\t",
    "    ",
    " ",
    "  ",
    "word\tword\t\tword",
    " \t \t mixed \t ",
    "trailing spaces   ",
    "trailing tab\t",
    "carriage\rreturn",
    "\r",
    "form\x0cfeed and vertical\x0btab",
    "non\u00a0breaking\u00a0space and thin\u2009space and em\u2003space",
    "ideographic\u3000space\u3000here",
    "next\u0085line and line\u2028separator and paragraph\u2029separator",
    "zero\u200bwidth\u200bspace and word\u2060joiner and soft\u00adhyphen",
    "\ufeffbyte order mark at start",
    "ogham\u1680space and narrow\u202fno-break and medium\u205fmath",
    "x \u00a0 y\u3000\u3000z",
    "unit\x1fsep and record\x1esep",
    "bell\x07 and delete\x7f and escape\x1b[0m",
]

DIGITS = [
    "0",
    "42",
    "1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "1,000,000 and 1.000.000 and 1 000 000",
    "2024-01-15T13:45:30.123Z",
    "0x7fffffff 0b101010 0o777 1e-10 6.022e23 -0.0 +1",
    "+1 (555) 123-4567",
    "abc123def456ghi7890",
    "v1.2.3-rc.4+build.567",
    "\u0661\u0662\u0663\u0664 \u0967\u0968\u0969 \uff11\uff12\uff13",
    "x\u00b2 + y\u00b3 = z\u2074; \u00bd + \u00bc = \u00be; \u2160 \u216b",
    "1st 2nd 3rd 4th 100th",
    "$12.99 \u20ac5,00 \u00a3100 \u00a51000 \u20b9250",
]

CJK = [
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u6211\u4eec\u6b63\u5728\u6d4b\u8bd5\u5206\u8bcd\u5668\u662f\u5426\u4e0e\u53c2\u8003\u5b9e\u73b0\u5b8c\u5168\u4e00\u81f4\u3002",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57\u3002",
    "\u6771\u4eac\u30bf\u30ef\u30fc\u306f333\u30e1\u30fc\u30c8\u30eb\u3067\u3059\u3002",
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "\u7e41\u9ad4\u4e2d\u6587\u8207\u7b80\u4f53\u4e2d\u6587\u6df7\u5408 mixed with English words",
    "\uff21\uff22\uff23 \uff41\uff42\uff43 fullwidth\uff01\uff1f",
    "\u3010\u62ec\u5f27\u3011\u300c\u5f15\u7528\u300d\u300e\u4e8c\u91cd\u300f\u3001\u53e5\u70b9\u3002",
    "\U00020000\U0002a6d6 rare CJK extension characters \U00030000",
]

EMOJI = [
    "\U0001f600 \U0001f602 \U0001f923 \U0001f60d",
    "family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 and couple \U0001f469\u200d\u2764\ufe0f\u200d\U0001f468",
    "thumbs \U0001f44d\U0001f3fd skin tones \U0001f44b\U0001f3fb\U0001f44b\U0001f3ff",
    "flags \U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5 rainbow \U0001f3f3\ufe0f\u200d\U0001f308",
    "keycaps 1\ufe0f\u20e3 #\ufe0f\u20e3 hearts \u2764\ufe0f \u2764 \U0001f9e1",
    "\U0001f680\U0001f680\U0001f680 launch!!! \U0001f389\U0001f38a",
    "emoji\U0001f600inside\U0001f600words",
    "\U0001f9d1\u200d\U0001f4bb programmer and \U0001f469\U0001f3fe\u200d\U0001f52c scientist",
]

COMBINING = [
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, n\u0303 vs \u00f1",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u0357\u0346\u033dl\u0341\u0357g\u0315o\u0309 text",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1",
    "\u1100\u1161\u11a8 decomposed hangul jamo vs \uac01",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e (Devanagari)",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a (Thai)",
    "\ufb01le \ufb02ow \u2126 \u212b \u2167 \u00b5 compatibility characters",
    "a\u0308\u0304 o\u0328\u0304 combining sequences in a row\u0301\u0301\u0301",
    "\u0915\u094d\u200d\u0937 conjunct with ZWJ",
]

RTL = [
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "English then \u0627\u0644\u0639\u0631\u0628\u064a\u0629 then English again 123",
    "\u200fright-to-left mark and \u202eoverride\u202c and \u200eleft mark",
    "\u0628\u0650\u0633\u0652\u0645\u0650 \u0627\u0644\u0644\u0651\u064e\u0647\u0650 with harakat",
    "\u05d4\u05b8\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea with niqqud and numbers \u0661\u0662\u0663",
    "\u0641\u0627\u0631\u0633\u06cc \u06a9\u06cc\u0628\u0648\u0631\u062f \u06f1\u06f2\u06f3",
]

SPECIAL = [
    "<s>",
    "</s>",
    "<unk>",
    "<s>Hello</s>",
    "Hello <s> world </s> again",
    "<s><s></s></s>",
    "<<s>> < s> <S> </ s> <s",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "text<|reserved_special_token_5|>text <|reserved_special_token_250|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "before<|endoftext|>after <|endoftext|> spaced",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_start <|im_end| |im_start|> partial tokens",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "  <s>  spaces around  </s>  ",
    "\t<|endoftext|>\t",
]

INVALID = [
    b"invalid \xff\xfe bytes",
    b"truncated \xe4\xb8 sequence",
    b"overlong \xc0\xaf slash",
    b"surrogate \xed\xa0\x80 half",
    b"\x80leading continuation",
    b"ends with lead byte \xf0\x9f\x98",
    b"\xf5\xf6\xf7 out of range leads",
    b"valid \xe2\x82\xac then \xe2\x82 cut",
]


def long_lines(rng):
    letters = "abcdefghijklmnopqrstuvwxyz"
    yield "Pneumonoultramicroscopicsilicovolcanoconiosis " + "supercalifragilisticexpialidocious" * 12
    yield "".join(rng.choice(letters) for _ in range(1500))
    yield "".join(rng.choice(letters + letters.upper() + "0123456789") for _ in range(1000))
    yield "a" * 1200
    yield "=" * 300 + " " * 300 + "-" * 100
    yield "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(300))
    yield "https://example.com/" + "/".join("segment%d" % i for i in range(60)) + "?q=" + "x" * 200
    yield "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                  for _ in range(800)) + "=="
    yield "9" * 400
    yield "\U0001f600" * 100 + "\U0001f468\u200d\U0001f469\u200d\U0001f467" * 20
    yield "\t" * 50 + "tabs" + " \t" * 50


def random_mix(rng, count):
    # Short random strings over a deliberately mixed alphabet: what fixed examples miss.
    alphabet = (list("abcXYZ019 \t'.,;!?-_()[]{}<>/\\\"|") +
                ["\u00e9", "\u00df", "\u0130", "\u03c3", "\u0416", "\u4e2d", "\u6587", "\u3042",
                 "\uac00", "\u0645", "\u05d0", "\u0301", "\u200d", "\u00a0", "\u3000", "\u0085",
                 "\U0001f600", "\U0001f44d", "\U0001f3fd", "\u2581", "\u0120", "\u010a", "<s>",
                 "</s>", "<|endoftext|>", "<|im_start|>", "'s", "'LL", "  ", "\r", "\u2028"])
    for _ in range(count):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer/corpus.txt")
    rng = random.Random(20240611)
    lines = []
    for group in (PROSE, CODE, WHITESPACE, DIGITS, CJK, EMOJI, COMBINING, RTL, SPECIAL):
        lines.extend(line.encode("utf-8") for line in group)
        lines.append(b"")  # empty lines between the groups
    lines.extend(INVALID)
    lines.append(b"")
    lines.append(b"")
    lines.extend(line.encode("utf-8") for line in long_lines(rng))
    lines.extend(line.encode("utf-8") for line in random_mix(rng, 120))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"\n".join(lines) + b"\n")


if __name__ == "__main__":
    main()
