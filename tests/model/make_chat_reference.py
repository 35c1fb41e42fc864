#!/usr/bin/env python3
"""Writes tests/model/data/chat_reference.json: chat templates rendered by jinja2, the reference
for sparq's C++ renderer (ChatTemplate, include/sparq/chat.h; tests/model/chat_template_test.cc).

    python3 tests/model/make_chat_reference.py [--model SmolLM2-135M-Instruct.Q4_1.gguf]

Needs python3 with jinja2 and gguf (pip install jinja2 gguf numpy, in a virtual environment).
The SmolLM2 template is read from the GGUF's `tokenizer.chat_template` by the gguf package; the
others are written here: ChatML spelled in other ways that mean the same layout (which sparq must
recognise), and templates of other layouts or with constructs sparq does not model (which it must
refuse). Rendering follows Hugging Face's apply_chat_template: an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, raise_exception as a global, and
messages, add_generation_prompt, bos_token and eos_token as variables.
"""
import argparse
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

BOS, EOS = "<|im_start|>", "<|im_end|>"  # SmolLM2's bos_token / eos_token texts
DASHES_BOS = "<|endoftext|>"  # a BOS text that is not a ChatML marker, for the template writing it

# ChatML written differently: '-' whitespace control over several lines, attribute access,
# {{ bos_token }} first, the default system message before the loop.
CHATML_DASHES = r"""{{- bos_token }}
{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# ChatML relying on trim_blocks / lstrip_blocks alone (no '-'), with a comment and '~'.
CHATML_TRIM_BLOCKS = r"""{# ChatML, as in the transformers documentation #}
{% for message in messages %}
{{ '<|im_start|>' ~ message["role"] ~ '\n' ~ message["content"] ~ '<|im_end|>\n' }}{% endfor %}
  {% if add_generation_prompt %}
{{ "<|im_start|>assistant\n" }}{% endif %}"""

# The HF documentation's plain ChatML (SmolLM v1 Instruct's template).
CHATML_PLAIN = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")

# Templates sparq must refuse (they render differently from ChatML, or use what it does not model).
REFUSED = {
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim "
        "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
        "{{ content }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
    "zephyr": (
        "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
        "message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
        "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
        "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"),
    "chatml_trim_filter": CHATML_PLAIN.replace("message['content']", "message['content'] | trim"),
    "chatml_set_system": (
        "{% set system = 'You are X.' %}{{ '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}"
        + CHATML_PLAIN),
    "chatml_stray_text": CHATML_PLAIN.replace("{% endfor %}", "\n{% endfor %}"),
    "chatml_no_newline_after_last": CHATML_PLAIN.replace(
        "'<|im_end|>' + '\\n'}}", "'<|im_end|>'}}{% if not loop.last %}{{ '\\n' }}{% endif %}"),
    "chatml_role_prefix": CHATML_PLAIN.replace("message['role'] + '\\n'", "message['role'] + ':\\n'"),
    "chatml_unconditioned_system": "{{ '<|im_start|>system\\nAlways.<|im_end|>\\n' }}" + CHATML_PLAIN,
}

CASES = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Hi! How can I help?"},
      {"role": "user", "content": "Tell me a joke.\nA short one."}], True),
    ([{"role": "user", "content": "Ünïcödé ✓ 日本 — 'quotes' \"too\" {{ not jinja }}"}], False),
]


def render(template, messages, add_generation_prompt, bos=BOS):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=EOS)


def gguf_template(path):
    import gguf
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    cache = os.environ.get("SPARQ_CACHE", os.path.expanduser("~/.cache/sparq"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data", "chat_reference.json"))
    args = ap.parse_args()

    recognised = [
        ("smollm2", "tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf",
         gguf_template(args.model), "You are a helpful AI assistant named SmolLM, trained by Hugging Face", False),
        ("chatml_plain", "the transformers documentation's ChatML (SmolLM v1 Instruct)", CHATML_PLAIN, "", False),
        ("chatml_dashes", "ChatML with '-' whitespace control, attribute access, bos_token", CHATML_DASHES,
         "You are a helpful assistant.", True),
        ("chatml_trim_blocks", "ChatML relying on trim_blocks / lstrip_blocks, a comment, '~'",
         CHATML_TRIM_BLOCKS, "", False),
    ]
    templates = []
    for name, source, tmpl, system, emits_bos in recognised:
        bos = DASHES_BOS if emits_bos else BOS
        templates.append({
            "name": name, "source": source, "template": tmpl, "recognised": True, "family": "chatml",
            "default_system": system, "emits_bos": emits_bos, "bos_token": bos,
            "cases": [{"messages": m, "add_generation_prompt": g, "text": render(tmpl, m, g, bos)}
                      for m, g in CASES]})
    for name, tmpl in REFUSED.items():
        first = CASES[0]
        templates.append({"name": name, "source": "written for this test", "template": tmpl,
                          "recognised": False, "bos_token": BOS,
                          "jinja2_text": render(tmpl, first[0], first[1])})
    doc = {"generator": "tests/model/make_chat_reference.py", "jinja2": jinja2.__version__,
           "eos_token": EOS, "templates": templates}
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}: {len(templates)} templates")


if __name__ == "__main__":
    main()
