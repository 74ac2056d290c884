#!/usr/bin/env python3
"""Writes corpus.jsonl: the strings the tokenizer parity tests encode with specd and with the
reference libraries (sentencepiece for Llama 2, transformers.js for Llama 3).

Deterministic (fixed seed, no input files), so the committed corpus can be regenerated and
reviewed:  /usr/bin/python3 tests/data/tokenizer/make_corpus.py > tests/data/tokenizer/corpus.jsonl

Each line is {"id": N, "category": "...", "text": "..."} with ASCII-only JSON escapes, so lone
combining marks, U+2028 or "\r" can never be mistaken for line structure by any reader.
JSON strings cannot hold invalid UTF-8; those inputs live in the C++ test instead.
"""

import json
import random
import sys

SEED = 20240611
rng = random.Random(SEED)

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Speculative decoding lets a small draft model propose tokens that a larger model verifies in one pass.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "Please don't forget to bring your umbrella; the forecast says it'll rain after 3 p.m.",
    "The committee's decision, announced on Tuesday, surprised almost everyone.",
    "Why would anyone write a tokenizer by hand? Because the reference must be matched exactly.",
    "A journey of a thousand miles begins with a single step.",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal.",
    "E-mail me at someone@example.com or visit https://example.org/path?query=1&lang=en#section.",
    "He said, \"I'll be there at 10:30,\" but he didn't arrive until noon.",
    "The price rose from $4.99 to $5.49 (a 10% increase) in under a week.",
    "Once upon a time, there was a little girl named Lily who loved to play in the park.",
    "Tokenization splits text into pieces; byte-level BPE never needs an unknown token.",
    "They're sure we've seen it, and I'm sure you'd agree that it's theirs.",
    "Rain, rain, go away -- come again another day!",
    "All models are wrong, but some are useful.",
    "The mitochondria is the powerhouse of the cell.",
    "To be, or not to be: that is the question.",
    "Colorless green ideas sleep furiously.",
    "Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow.",
    "How vexingly quick daft zebras jump!",
    "Grumpy wizards make toxic brew for the evil queen and jack.",
    "The five boxing wizards jump quickly.",
    "Bright vixens jump; dozy fowl quack.",
    "Let's meet at the café near the station -- the one with the naïve mural.",
    "Every morning, Tom walked his dog along the river before going to work.",
    "Numbers like 3.14159, 2.71828 and 1.41421 appear everywhere in mathematics.",
]

WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or have an "
    "they which one you were all we her she there would their will when who him been has more if "
    "no out so said what up its about than into them can only other time new some could these two "
    "may first then do any like my now over such our man me even most made after also did many off "
    "before must well back through years much where your way down should because each just those "
    "people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year since "
    "come against go came right used take three small speculative decoding tokenizer transformer "
    "verification acceptance probability distribution sampler throughput latency kernel batch "
    "unbelievably internationalization antidisestablishmentarianism rhythm queue strengths"
).split()

CODE = [
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (int x : v) sum += x;\n  return 0;\n}\n",
    "template <typename T>\nT Max(const T& a, const T& b) { return a < b ? b : a; }",
    "absl::StatusOr<std::unique_ptr<Foo>> Foo::Create(const Config& config) {\n\tif (!config.ok()) return absl::InvalidArgumentError(\"bad\");\n}",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Node:\n    def __init__(self, value, next=None):\n        self.value = value\n        self.next = next\n",
    "import numpy as np\nx = np.arange(10).reshape(2, 5)\nprint(x.T @ x)\n",
    "{\"name\": \"specd\", \"version\": \"0.1.0\", \"dependencies\": {\"absl\": \"20220623\"}, \"tags\": [1, 2.5, null, true]}",
    "{\n  \"model\": {\n    \"type\": \"BPE\",\n    \"vocab\": {\"a\": 0, \"b\": 1},\n    \"merges\": [\"a b\"]\n  }\n}",
    "for (size_t i = 0; i < n; ++i) {\r\n    out[i] = a[i] * b[i] + c[i];\r\n}\r\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "if __name__ == \"__main__\":\n\tmain(sys.argv[1:])",
    "#define CHECK(x) do { if (!(x)) { fprintf(stderr, \"%s:%d\\n\", __FILE__, __LINE__); abort(); } } while (0)",
    "const auto it = std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.id == id; });",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # squares of multiples of three",
    "<html><head><title>Test</title></head><body><p class=\"x\">Hello&nbsp;world</p></body></html>",
    "git commit -m 'Fix off-by-one in KvPool::Truncate' && git push origin main",
    "    return {\"ids\": ids, \"text\": tok.decode(ids, skip_special_tokens=True)}",
    "std::cout << \"value: \" << std::setw(8) << std::hex << 0xDEADBEEF << std::endl;",
    "a=1;b=2;c=a+b;d=c*c;e=d/2;f=e-1;g=f%3;h=g<<1;i=h>>1;j=i^0xff;",
    "/* block comment */ // line comment\n/** Doxygen \\brief comment */",
]

ACCENTED = [
    "café", "naïve", "résumé", "coöperate", "Ångström", "São Paulo", "Zürich", "Kraków",
    "Dvořák", "Łódź", "Tiếng Việt có dấu", "Ελληνικά γράμματα", "Русский язык", "Українська",
    "e\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334a\u0315l\u0336g\u0358o",
    "\u0301\u0302\u0303 leading combining marks", "ﬁ ligature ﬂ", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "Ω≈ç√∫˜µ≤≥÷", "ß ẞ ſ", "İstanbul ıi", "ǅ ǈ ǋ titlecase digraphs", "Ⅻ ⅻ roman numerals",
]

CJK = [
    "你好，世界！", "我爱自然语言处理。", "中华人民共和国成立于1949年。", "東京都は日本の首都です。",
    "ひらがなとカタカナ", "カタカナ・テスト", "こんにちは、元気ですか？", "한국어 문장입니다.",
    "안녕하세요 세계", "\u1100\u1161\u11a8 decomposed jamo", "繁體中文與简体中文", "𠜎𠜱𠝹𠱓 (CJK Ext B)",
    "《红楼梦》是中国古典小说。", "ｶﾀｶﾅ halfwidth",
]

SCRIPTS = [
    "مرحبا بالعالم", "اللغة العربية جميلة جدا.", "שלום עולם", "עברית נכתבת מימין לשמאל.",
    "नमस्ते दुनिया", "हिन्दी भाषा में वाक्य।", "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "გამარჯობა", "Բարեւ աշխարհ", "ሰላም ልዑል", "வணக்கம்", "ສະບາຍດີ", "မင်္ဂလာပါ",
    "Hello مرحبا שלום mixed directions", "\u202eRTL override\u202c and \u200fRLM\u200e",
    "zero\u200bwidth\u200cjoiner\u200dtext\ufeffbom",
]

EMOJI = [
    "😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇺🇸🇫🇷🇯🇵", "🇩🇪", "❤️", "1️⃣ #️⃣ *️⃣",
    "🧑🏿\u200d🚀", "👩\u200d❤️\u200d💋\u200d👨", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    "☺︎ ☺️", "🐈\u200d⬛", "🫠🫶🪿", "I ❤️ NY 🗽!", "😂😂😂😂😂", "🤷\u200d♀️ whatever",
]

CONTRACTIONS = [
    "it's", "IT'S", "It'S", "don't", "DON'T", "Don'T", "we're", "WE'RE", "We'Re", "you've",
    "YOU'VE", "I'm", "I'M", "they'll", "THEY'LL", "They'Ll", "she'd", "SHE'D", "rock 'n' roll",
    "''s", "'s'", "'", "''", "'''", "O'Neil's", "the dogs' bones", "y'all'd've", "ma'am",
    "' s", "'S", "'LL", "'Re", "'ve 'm 'd", "’s curly apostrophe", "it’ll", "l'homme",
    "'tis", "'twas",
]

BYTE_LOOKALIKES = [
    "<0x0A>", "<0xFF>", "<0x00>", "<0x0a>", "<0x>", "<0x1G>", "\\xff", "\\x00\\x0a",
    "\\u00e9", "&#x1F600;", "%E2%82%AC", "<0x0A><0x0A>", "▁", "▁▁▁", "▁the", "Ġthe", "Ċ",
    "ĠĠ", "âĢĻ", "byte <0xE2><0x82><0xAC> euro",
]

SPECIAL_LOOKALIKES = [
    "<s>", "</s>", "<unk>", "<s> hello </s>", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<|reserved_special_token_5|>",
    "<|reserved_special_token_250|>", "<|eot_id", "eot_id|>", "<| eot_id |>", "< s >", "<<s>>",
    "<|im_start|>assistant", "[INST] hi [/INST]", "<<SYS>>\nsys\n<</SYS>>", "<pad>", "<mask>",
    "<|endoftext|>", "<|python_tag|>", "<|eom_id|>", "<S>", "</S>",
]

WHITESPACE_UNITS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\u00a0", "\u3000",
                    "\u2003", "\v", "\f", "\u0085", "\u2028", "\u2029"]

BLOCKS = [  # (lo, hi) code point ranges for random text
    (0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF),
    (0x2500, 0x27BF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF),
    (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x0300, 0x036F),
]


def rand_word():
    return rng.choice(WORDS)


def rand_sentence():
    n = rng.randint(3, 25)
    words = [rand_word() for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    s = " ".join(words)
    return s + rng.choice([".", "!", "?", ",", ";", ":", "", "..."])


def rand_number():
    kind = rng.randint(0, 9)
    length = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 16, 20, 31, 64])
    digits = "".join(rng.choice("0123456789") for _ in range(length))
    if kind == 0:
        return digits
    if kind == 1:
        return "-" + digits
    if kind == 2:
        return digits + "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 8)))
    if kind == 3:
        return f"{int(digits):,}"
    if kind == 4:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 6)}e}"
    if kind == 5:
        return f"{rng.randint(1, 31):02d}/{rng.randint(1, 12):02d}/{rng.randint(1900, 2100)}"
    if kind == 6:
        return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if kind == 7:
        return f"0x{rng.getrandbits(4 * min(length, 16)):x}"
    if kind == 8:
        return f"v{rng.randint(0, 20)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}"
    return " ".join(digits[i:i + 3] for i in range(0, len(digits), 3))


def rand_whitespace_run(max_units=6):
    return "".join(rng.choice(WHITESPACE_UNITS) for _ in range(rng.randint(1, max_units)))


def rand_codepoints(n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def rand_any_codepoints(n):
    """Any scalar value except U+0000 and surrogates, including unassigned ones."""
    out = []
    while len(out) < n:
        cp = rng.randint(1, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


FRAGMENT_MAKERS = [
    lambda: rand_sentence(),
    lambda: rng.choice(PROSE),
    lambda: rand_number(),
    lambda: rand_whitespace_run(),
    lambda: rng.choice(ACCENTED),
    lambda: rng.choice(CJK),
    lambda: rng.choice(SCRIPTS),
    lambda: rng.choice(EMOJI),
    lambda: rng.choice(CONTRACTIONS),
    lambda: rng.choice(BYTE_LOOKALIKES),
    lambda: rng.choice(SPECIAL_LOOKALIKES),
    lambda: rng.choice(CODE)[: rng.randint(5, 80)],
    lambda: rand_codepoints(rng.randint(1, 8)),
    lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") * rng.randint(1, 5),
]


def build():
    corpus = []

    def add(category, text):
        corpus.append((category, text))

    # Edge cases first, so their ids stay stable when categories grow.
    for text in ["", " ", "  ", "\n", "\t", "\r\n", "a", "A", ".", "0", "00", "000", "0000",
                 " a", "a ", " a ", "\n\na", "a\n\n", "▁", "\u00a0", "\ufeff", "\u0000",
                 "a\u0000b", "\x7f", "\u0001\u0002\u001f", "\uffff", "\ufffd", "\U0010ffff",
                 "\U000e0001", "\ufdd0"]:
        add("edge", text)

    for text in PROSE:
        add("prose", text)
        add("prose", " " + text)
        add("prose", text.upper())
        add("prose", text.lower() + "\n")
    for _ in range(300):
        n = rng.randint(1, 6)
        add("prose", " ".join(rand_sentence() for _ in range(n)))
    for _ in range(60):
        paras = ["".join(rng.choice(PROSE) + " " for _ in range(rng.randint(1, 4))).strip()
                 for _ in range(rng.randint(2, 4))]
        add("prose", rng.choice(["\n\n", "\n", "\r\n\r\n"]).join(paras))

    for text in CODE:
        add("code", text)
        add("code", text.replace("    ", "\t"))
    for _ in range(80):
        a, b = rng.sample(CODE, 2)
        add("code", a[: rng.randint(1, len(a))] + rand_whitespace_run(3) + b[rng.randint(0, len(b) - 1):])

    for n in range(1, 41):
        add("numbers", "".join(str((i * 7 + n) % 10) for i in range(n)))
    for _ in range(200):
        add("numbers", rand_number())
    for _ in range(60):
        add("numbers", f"{rand_word()}{rand_number()}{rng.choice(['', ' ', 'px', '%', 'km'])}")

    for unit in WHITESPACE_UNITS:
        for reps in [1, 2, 3, 8]:
            add("whitespace", unit * reps)
        add("whitespace", unit + "word")
        add("whitespace", "word" + unit)
        add("whitespace", "word" + unit + "word")
    for n in [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 257]:
        add("whitespace", " " * n + "x")
        add("whitespace", "x" + " " * n)
    for _ in range(120):
        add("whitespace", rand_whitespace_run(4) + rand_sentence() + rand_whitespace_run(4) +
            rand_sentence() + rand_whitespace_run(4))

    for group, category in [(ACCENTED, "accents"), (CJK, "cjk"), (SCRIPTS, "scripts"), (EMOJI, "emoji"),
                            (CONTRACTIONS, "contractions"), (BYTE_LOOKALIKES, "byte_lookalikes"),
                            (SPECIAL_LOOKALIKES, "special_lookalikes")]:
        for text in group:
            add(category, text)
            add(category, " " + text)
            add(category, "x" + text + "y")
        for _ in range(40):
            parts = [rng.choice(group) for _ in range(rng.randint(2, 5))]
            add(category, rng.choice(["", " ", "\n", "-"]).join(parts))
        for _ in range(20):
            add(category, rand_sentence() + " " + rng.choice(group) + " " + rand_sentence())

    for _ in range(60):
        word = rand_word()
        add("contractions", rng.choice([word, word.upper(), word.capitalize()]) +
            rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE",
                        "'M", "'LL", "'D", "'Ll", "'lL", "'rE"]) + rng.choice(["", " ", ".", "s"]))

    for n in [50, 100, 300, 1000, 3000]:
        add("long", "a" * n)
        add("long", "ab" * (n // 2))
        add("long", "9" * n)
        add("long", "!" * n)
        add("long", "😀" * (n // 10))
        add("long", "中" * (n // 5))
    add("long", "supercalifragilisticexpialidocious" * 30)
    add("long", "pneumonoultramicroscopicsilicovolcanoconiosis")
    add("long", "Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch")
    add("long", "".join(rand_word() for _ in range(200)))
    add("long", " ".join(rand_sentence() for _ in range(60)))
    add("long", "\n".join(CODE))

    for _ in range(150):
        add("random_blocks", rand_codepoints(rng.randint(1, 40)))
    for _ in range(60):
        add("random_scalars", rand_any_codepoints(rng.randint(1, 12)))

    for _ in range(700):
        n = rng.randint(2, 8)
        add("mixed", "".join(rng.choice(FRAGMENT_MAKERS)() for _ in range(n)))

    return corpus


def main():
    corpus = build()
    out = sys.stdout
    for i, (category, text) in enumerate(corpus):
        out.write(json.dumps({"id": i, "category": category, "text": text}, ensure_ascii=True))
        out.write("\n")


if __name__ == "__main__":
    main()
