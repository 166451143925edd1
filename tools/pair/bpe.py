"""Byte-level BPE: training, encoding, and the Hugging Face tokenizer.json it is saved as.

The pre-tokenizer is Llama 3's split regex followed by the GPT-2 byte-to-unicode mapping, so the
saved tokenizer.json is the same kind of file as Llama 3's and loads in Hugging Face tokenizers
and in specrun unchanged. Ids: 0..255 are the bytes, then one id per merge, then the special
tokens.
"""

import heapq
import json
from collections import Counter, defaultdict

import regex

SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
SPECIAL_TOKENS = (BEGIN_OF_TEXT, END_OF_TEXT)


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters (no spaces or controls)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, characters)}


BYTE_TO_CHAR = bytes_to_unicode()
SPLITTER = regex.compile(SPLIT_PATTERN)


def pre_tokenize(text):
    return SPLITTER.findall(text)


def train(texts, vocab_size):
    """Learns vocab_size - 256 - len(SPECIAL_TOKENS) merges; returns the list of (a, b) id pairs."""
    word_counts = Counter()
    for text in texts:
        word_counts.update(pre_tokenize(text))
    words = [list(word.encode("utf-8")) for word in word_counts]
    counts = list(word_counts.values())

    pair_counts = defaultdict(int)
    pair_words = defaultdict(set)
    for index, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += counts[index]
            pair_words[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges = []
    next_id = 256
    wanted = vocab_size - 256 - len(SPECIAL_TOKENS)
    while len(merges) < wanted and heap:
        negative_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative_count or negative_count == 0:
            continue  # stale heap entry
        merges.append(pair)
        new_id = next_id
        next_id += 1
        changed = defaultdict(int)
        for index in list(pair_words[pair]):
            symbols = words[index]
            count = counts[index]
            for old in zip(symbols, symbols[1:]):
                changed[old] -= count
                pair_counts[old] -= count
            merged = []
            position = 0
            while position < len(symbols):
                if (position + 1 < len(symbols) and symbols[position] == pair[0]
                        and symbols[position + 1] == pair[1]):
                    merged.append(new_id)
                    position += 2
                else:
                    merged.append(symbols[position])
                    position += 1
            words[index] = merged
            for new in zip(merged, merged[1:]):
                changed[new] += count
                pair_counts[new] += count
                pair_words[new].add(index)
        del pair_counts[pair]
        del pair_words[pair]
        for changed_pair, delta in changed.items():
            if changed_pair == pair or delta == 0:
                continue
            count = pair_counts.get(changed_pair, 0)
            if count > 0:
                heapq.heappush(heap, (-count, changed_pair))
    return merges


class Tokenizer:
    """Encodes and decodes with a list of merges; the reference the runtime is tested against."""

    def __init__(self, merges):
        self.merges = [tuple(pair) for pair in merges]
        self.rank = {pair: rank for rank, pair in enumerate(self.merges)}
        self.token_bytes = [bytes([byte]) for byte in range(256)]
        for a, b in self.merges:
            self.token_bytes.append(self.token_bytes[a] + self.token_bytes[b])
        self.special_ids = {
            name: len(self.token_bytes) + offset for offset, name in enumerate(SPECIAL_TOKENS)
        }
        self.bos_id = self.special_ids[BEGIN_OF_TEXT]
        self.eos_id = self.special_ids[END_OF_TEXT]
        self.vocab_size = len(self.token_bytes) + len(SPECIAL_TOKENS)
        self._cache = {}

    def _encode_word(self, word):
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word.encode("utf-8"))
        while len(symbols) > 1:
            best_rank, best_position = None, -1
            for position, pair in enumerate(zip(symbols, symbols[1:])):
                rank = self.rank.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_position = rank, position
            if best_rank is None:
                break
            symbols[best_position:best_position + 2] = [256 + best_rank]
        if len(self._cache) < 1_000_000:
            self._cache[word] = symbols
        return symbols

    def encode(self, text, add_bos=False):
        """Plain text to ids (special-token strings in the text are not recognised)."""
        ids = [self.bos_id] if add_bos else []
        for word in pre_tokenize(text):
            ids.extend(self._encode_word(word))
        return ids

    def decode(self, ids):
        return b"".join(self.token_bytes[i] for i in ids if i < len(self.token_bytes)).decode(
            "utf-8", errors="replace")

    def token_string(self, token_id):
        return "".join(BYTE_TO_CHAR[byte] for byte in self.token_bytes[token_id])

    def to_json(self):
        """The Hugging Face tokenizer.json: Llama 3's layout, adding the BOS token."""
        vocab = {self.token_string(i): i for i in range(len(self.token_bytes))}
        if len(vocab) != len(self.token_bytes):
            raise ValueError("two merges produced the same token")
        added = [
            {"id": token_id, "content": name, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for name, token_id in self.special_ids.items()
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN},
                     "behavior": "Isolated", "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                     "use_regex": False},
                ],
            },
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    BEGIN_OF_TEXT: {"id": BEGIN_OF_TEXT, "ids": [self.bos_id],
                                    "tokens": [BEGIN_OF_TEXT]},
                },
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": vocab,
                "merges": [f"{self.token_string(a)} {self.token_string(b)}"
                           for a, b in self.merges],
            },
        }

    @staticmethod
    def from_json(document):
        """Reads back the merges of a tokenizer.json this module wrote."""
        model = document["model"]
        vocab = model["vocab"]
        merges = [tuple(vocab[part] for part in merge.split(" ")) for merge in model["merges"]]
        return Tokenizer(merges)


def save(tokenizer, path):
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(tokenizer.to_json(), stream, ensure_ascii=False, indent=1)
        stream.write("\n")


def load(path):
    with open(path, encoding="utf-8") as stream:
        return Tokenizer.from_json(json.load(stream))
