"""Texts real models write (and users type) that a renderer must show as written, modulo CommonMark + GFM (#22).

Each case is the chunks a model server streams, in order: a sequence split across chunks stays split, as a
tokenizer splits it (``key`` | ``:value``). The source is the chunks joined. tests/e2e/test_fidelity.py streams
each one from the fake server, renders it in Chromium and compares the visible text with the same source
rendered by a standard CommonMark + GFM renderer (markdown-it-py). ``TYPED`` are the cases a user types.
"""

from __future__ import annotations

FENCE = "```"

CORPUS: dict[str, list[str]] = {
    "word-colon-word": ["set key", ":value and model:", "qwen3 in C", ":Users now"],
    "typed-directive": ["hx:normal which is better"],
    "technical-pairs": [
        "Pull image:tag, log in as user:password, then open namespace:name; postgres://user:pw@db:5432/app ",
        "and http://localhost:8000/v1:chat for key:value pairs.",
    ],
    "emoji-shortcodes": [":smile: Great question! :", "thumbsup: and :rocket:"],
    "windows-paths": ["Open C:\\Users\\name\\AppData and D:", "\\data\\models before E:\\ "],
    "chat-template-tokens": [
        "The answer ends with <|im_end|> and the next turn starts with <|im_",
        "start|>assistant.",
    ],
    "generics": ["Use List<String> or Map<String, ", "Integer> in Java; Vec<u8> in Rust."],
    "raw-html-as-text": [
        "<div>hello</div> and <b>bold?</b> ",
        "<script>alert(1)</script> <img src=x onerror=alert(1)> <!-- note -->",
    ],
    "dollars": ["It costs $5-$10 per hour, or $", "20 a day ($1.5k/month)."],
    "chinese-full-width": ["配置项：值，模型：qwen3，路径：C:\\Users\\用户", "；时间 12:30，比例 3:1。"],
    "code-spans": [
        "Run `docker run image:tag`, then `a:b:c`, `<|im_end|>`, `List<String>`, `:smile:`, ",
        "`C:\\Users\\name`, `$5-$10`, `<b>x</b>` and `配置：值`.",
    ],
    "fenced-block": [
        "Config:\n\n",
        FENCE + "yaml\nimage: nginx:1.25\nkey:value\nC:\\Users\\name\n<|im_end|>\n",
        "List<String> :smile: $5-$10 <div>x</div>\n配置：值\n" + FENCE + "\n\nDone:ok.",
    ],
    "colons-only": [":a:b:c"],
    "colon-line-starts": ["::name on its own line\n\n:::", "info\nnot an alert\n:::\n\nend"],
    "unclosed-fence": ["Here:\n\n" + FENCE + "python\nprint('a:b')\nx = {'k':", "v}\n"],
    "split-fence": ["Before\n\n``", "`\nkey:", "value\n``", "`\n\nafter:wards"],
}

TYPED = ["typed-directive", "word-colon-word", "technical-pairs", "emoji-shortcodes", "windows-paths", "generics"]


def source(name: str) -> str:
    return "".join(CORPUS[name])
