"""Tokenizers and chat templates from model files.

``tokenizer.json`` is loaded with the ``tokenizers`` library, whose post-processor adds the
special tokens (BOS, or CLS/SEP) the file asks for. Chat templates (Jinja) are rendered with
jinja2 the way Hugging Face ``transformers`` renders them in ``apply_chat_template``
(``utils/chat_template_utils.py``): a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block, the
``raise_exception`` and ``strftime_now`` globals, a ``tojson`` filter that does not escape
HTML, and the special tokens (``bos_token``, ``eos_token``, ...) passed as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from eggfuse.ir import InputError, ModelError

from .config_fields import read_json_object

#: transformers' SPECIAL_TOKENS_ATTRIBUTES: the special tokens a chat template can read.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def load_tokenizer_json(path: Path, *, padding: bool = False):
    """The ``tokenizers.Tokenizer`` of a ``tokenizer.json``, with the padding and truncation
    stored in the file switched off (callers set their own) unless ``padding``.

    Raises :class:`ModelError` naming the file when it is missing or unreadable.
    """
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelError(f"{path.parent}: no tokenizer.json (the tokenizers-library file a Hugging Face "
                         "model folder ships); add it to the folder")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise ModelError(f"{path}: cannot load tokenizer ({e})") from None
    if not padding:
        tok.no_padding()
        tok.no_truncation()
    return tok


def _token_text(value: Any, path: Path, key: str) -> str | None:
    # A special token as tokenizer_config.json stores it: a string, an AddedToken dict, or null.
    text = value.get("content") if isinstance(value, dict) else value
    if text is not None and not isinstance(text, str):
        raise ModelError(f"{path}: {key} must be the token's text (a string, or an object with a string "
                         f"\"content\"), got {value!r}; correct it in the file")
    return text


def special_tokens(folder: Path) -> dict[str, str]:
    """The named special tokens of a model folder (``bos_token``: "<s>", ...), from
    ``tokenizer_config.json``, else the legacy ``special_tokens_map.json``; absent ones left out.
    Raises :class:`ModelError` naming the file for one that is not a JSON object, or a token
    that is not text."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
        path = folder / name
        if path.is_file():
            data = read_json_object(path)
            for key in SPECIAL_TOKEN_NAMES:
                if (text := _token_text(data.get(key), path, key)) is not None:
                    found[key] = text
    return found


def find_chat_template(folder: Path) -> tuple[str, str] | None:
    """(template, where it came from) of a model folder, or None.

    As transformers looks for it: ``chat_template.jinja`` first, then ``chat_template.json``
    (``{"chat_template": ...}``), then the ``chat_template`` entry of ``tokenizer_config.json``
    (a string, or a list of ``{"name", "template"}`` of which ``default`` is taken).
    Raises :class:`ModelError` for a list without a ``default`` template, a ``chat_template``
    of another type, or a file that is not a JSON object.
    """
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8"), path.name
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        template = read_json_object(path).get("chat_template")
        if template is not None and not isinstance(template, (str, list)):
            raise ModelError(f"{path}: chat_template must be a string (the Jinja source) or a list of "
                             f"{{\"name\", \"template\"}} objects, got {template!r}; correct it in the file")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            if "default" not in named:
                raise ModelError(f"{path}: chat_template lists templates {sorted(map(str, named))} but none named "
                                 "'default'")
            template = named["default"]
            if not isinstance(template, str):
                raise ModelError(f"{path}: chat_template's 'default' template must be a string (the Jinja source), "
                                 f"got {template!r}; correct it in the file")
        if isinstance(template, str):
            return template, name
    return None


class ChatTemplate:
    """A model's chat template (Jinja source), compiled once; ``where`` names its file in messages.

    Raises :class:`ModelError` when the source is not a valid template.
    """

    def __init__(self, source: str, tokens: dict[str, str], where: str) -> None:
        import jinja2

        self.source, self.tokens, self.where = source, dict(tokens), where
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ModelError(f"{where}: the chat template does not compile ({type(e).__name__}: {e})") from None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation ``messages`` (dicts with ``role`` and ``content``) as prompt text,
        ending with the assistant's header when ``add_generation_prompt``.

        Raises :class:`InputError` when the template refuses the conversation (its
        ``raise_exception``) and :class:`ModelError` when it fails otherwise.
        """
        import jinja2

        try:
            return self._template.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.tokens)
        except jinja2.TemplateError as e:
            raise InputError(f"{self.where}: the chat template refused the conversation: {e}") from None
        except Exception as e:  # noqa: BLE001 - a template can fail in any Python way
            raise ModelError(f"{self.where}: the chat template failed ({type(e).__name__}: {e})") from None

    def user_turn(self, text: str, system: str | None = None) -> str:
        """One user turn (after a system turn when ``system`` is given), ready for the assistant."""
        messages = [] if system is None else [{"role": "system", "content": system}]
        return self.render([*messages, {"role": "user", "content": text}])


def _environment():
    """transformers' ``_cached_compile_jinja_template`` environment (see the module docstring)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        # {% generation %}...{% endgeneration %}: transformers marks assistant text with it; the text is kept
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
