"""Chat templates: the built-in Gemma and ChatML formats, GGUF-provided templates, overrides, and template errors
as client errors. Pure Jinja2: no model."""

import logging

import pytest

from pydflash.errors import InvalidRequest
from pydflash.server import chat
from pydflash.server.chat import ChatTemplate, ChatTemplateError, resolve

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Answer in English."},
    {"role": "user", "content": "Hi "},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def gemma():
    return resolve(None, "gemma3", None, bos_token="<bos>", eos_token="<eos>")


def test_gemma_full_conversation():
    assert gemma().render(CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nAnswer in English.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_without_generation_prompt_and_without_system():
    out = gemma().render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert out == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_gemma_emits_bos_so_the_tokenizer_must_not():
    assert gemma().emits_bos
    assert not resolve(None, "llama", None, bos_token="<s>").emits_bos
    assert not resolve(None, "gemma3", None).emits_bos  # no BOS text known: nothing emitted


def test_emits_bos_of_a_template_that_refuses_the_probe():
    strict = "{{- bos_token }}{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    assert ChatTemplate(strict, "strict", bos_token="<s>").emits_bos
    assert not ChatTemplate("{{ raise_exception('no') }}", "refuses", bos_token="<s>").emits_bos


@pytest.mark.parametrize("messages,reason", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "alternate"),
    ([{"role": "assistant", "content": "a"}], "alternate"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "beginning"),
])
def test_gemma_refusals_are_invalid_requests(messages, reason):
    with pytest.raises(InvalidRequest, match=reason):
        gemma().render(messages)


def test_chatml_full_conversation_maps_developer_to_system():
    t = resolve(None, "qwen2", None)
    assert t.name == "chatml"
    assert t.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>system\nAnswer in English.<|im_end|>\n"
        "<|im_start|>user\nHi <|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# A GGUF-style template using HF's extras: bos_token, raise_exception, tojson, loop controls, namespace.
CUSTOM = """{{ bos_token }}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant', 'developer'] %}\
{{ raise_exception('bad role ' + m.role) }}{% endif %}{% if m.content == 'skip' %}{% continue %}{% endif %}\
[{{ m.role }}]{{ m.content | tojson }}
{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"""


def test_gguf_template_is_used_with_hf_extras():
    t = resolve(CUSTOM, "gemma3", None, bos_token="<s>")
    assert t.name == "gguf:tokenizer.chat_template"
    out = t.render([{"role": "developer", "content": "dév"}, {"role": "user", "content": "skip"},
                    {"role": "user", "content": "q"}])
    # The template mentions 'developer', so the role is passed through; tojson keeps non-ASCII as is.
    assert out == '<s>[developer]"dév"\n[user]"q"\n[assistant]'
    assert t.emits_bos


def test_template_raise_exception_is_invalid_request():
    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}", "custom")
    with pytest.raises(InvalidRequest, match="custom: Conversation roles must alternate"):
        t.render([{"role": "user", "content": "x"}])


def test_template_runtime_failure_is_invalid_request():
    t = ChatTemplate("{{ messages[0]['content'] + 1 }}", "custom")
    with pytest.raises(InvalidRequest, match="cannot render"):
        t.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_unsafe_access():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}", "evil")
    with pytest.raises(InvalidRequest):
        t.render([])
    t = ChatTemplate("{% set x = messages.append(1) %}", "mutating")
    with pytest.raises(InvalidRequest):
        t.render([])


def test_strftime_now_available():
    out = ChatTemplate("{{ strftime_now('%Y') }}", "date").render([])
    assert out.isdigit() and len(out) == 4


def test_broken_gguf_template_falls_back_to_architecture(caplog):
    with caplog.at_level(logging.WARNING, logger="pydflash.server.chat"):
        t = resolve("{% for %}", "gemma3", None, bos_token="<bos>")
    assert t.name == "gemma" and "does not compile" in caplog.text


def test_override_by_name_wins_over_gguf():
    assert resolve(CUSTOM, "gemma3", "chatml").name == "chatml"


def test_override_by_file(tmp_path):
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", encoding="utf-8")
    t = resolve(CUSTOM, "gemma3", str(f))
    assert t.name == str(f)
    assert t.render([{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]) == \
        "<system>d<user>u"


@pytest.mark.parametrize("override,match", [("nosuchname", "unknown chat template 'nosuchname'"),
                                            ("./missing.jinja", "file not found"),
                                            ("/nonexistent/dir/t.jinja", "file not found")])
def test_bad_override_is_a_clear_error(override, match):
    with pytest.raises(ChatTemplateError, match=match):
        resolve(None, "gemma3", override)


def test_bad_template_file_does_not_compile(tmp_path):
    f = tmp_path / "bad.jinja"
    f.write_text("{% if %}", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="does not compile"):
        resolve(None, "gemma3", str(f))


def test_resolution_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="pydflash.server.chat"):
        resolve(None, "gemma3", None)
    assert "built-in 'gemma'" in caplog.text and "gemma3" in caplog.text


def test_builtins_are_the_documented_names():
    assert set(chat.BUILTIN) == {"gemma", "chatml"}


@pytest.mark.real_model
def test_real_gemma_prompt_tokens(gemma_path):
    """The default target has no template in its GGUF: the built-in must give Gemma's own token sequence, with
    one BOS when tokenized as the server does (add_special=not emits_bos, parse_special=True)."""
    from pydflash.compat.gguf_meta import read_metadata
    from pydflash.native.handles import Model

    model = Model(gemma_path)
    try:
        bos = model.token_to_piece(model.bos, special=True).decode()
        t = resolve(read_metadata(gemma_path).get("tokenizer.chat_template"), model.arch, None, bos_token=bos)
        assert t.name == "gemma"
        text = t.render([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        toks = model.tokenize(text, add_special=not t.emits_bos, parse_special=True)
        pieces = [model.token_to_piece(x, special=True).decode() for x in toks]
    finally:
        model.close()
    assert pieces == ["<bos>", "<start_of_turn>", "user", "\n", "Be", " brief", ".", "\n\n", "Hi", "<end_of_turn>",
                      "\n", "<start_of_turn>", "model", "\n"]
