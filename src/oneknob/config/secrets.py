"""Credentials in what a user pastes: found by name, masked before oneknob writes or prints anything.

A bug report's command line (from_command=...) often carries a token: `HF_TOKEN=hf_... vllm serve M --api-key
sk-...`. oneknob writes that line into report.md (meant for a public issue), summary.json, the journal, MLflow
tags and the parse cache, and prints it in retry lines; so a secret's value is replaced by MASK as the line is
read, and the masked line is the only one any of them sees. Secret by name: a flag or keyword argument whose
name ends in token / key / secret / password (--api-key, --hf-token, hf_token=...), an environment assignment
whose name does (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY), and any flag vLLM's own parser redacts from
its log (its _SENSITIVE_ARG_FIELDS, read in the build's interpreter: oneknob.engines.vllm_command). None of them
is carried into the study (they change no numerics): the engine takes them from the environment it runs in.
"""

from __future__ import annotations

import ast
import re
import shlex

MASK = "***"
_NAME = re.compile(r"(?:^|_)(?:token|key|secret|password|passwd|credentials?)$|secret", re.I)


def secret_name(name: str) -> bool:
    """Whether a flag (--api-key), keyword (hf_token) or variable (HF_TOKEN) names a credential by its name:
    --max-num-batched-tokens does not (tokens, plural, is a count)."""
    return bool(_NAME.search(str(name).lstrip("-").replace("-", "_")))


def _after(words: list[str], option: str) -> list[str]:
    """The values `option` takes in `words`: the word after it, or what follows its '='."""
    found = []
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words) and not words[i + 1].startswith("-"):
            found.append(words[i + 1])
        elif word.startswith(option + "="):
            found.append(word[len(option) + 1:])
    return found


def values_in_words(words: list[str], options: tuple[str, ...] = ()) -> set[str]:
    """The secret values of a shell line's words: after a secret-named flag (or one of `options`, the flags the
    parser marks secret), and in a secret-named VAR=value."""
    found: set[str] = set()
    for word in words:
        name, sep, value = word.partition("=")
        if sep and not name.startswith("-") and re.fullmatch(r"[A-Za-z_]\w*", name) and secret_name(name):
            found.add(value)
    for word in words:
        option = word.split("=", 1)[0]
        if option.startswith("--") and (secret_name(option) or option in options):
            found.update(_after(words, option))
    return {v for v in found if v and v != MASK}


def values_in_call(text: str) -> set[str]:
    """The secret values of an LLM(...) call's keyword arguments (hf_token='...')."""
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return set()
    return {str(k.value.value) for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords
            if k.arg and secret_name(k.arg) and isinstance(k.value, ast.Constant) and k.value.value not in (None, "")
            and not isinstance(k.value.value, bool)}


def mask(text: str, values: set[str]) -> str:
    """`text` with every whole-word occurrence of each value replaced by MASK (a value inside a longer word is
    not one)."""
    for value in sorted(values, key=len, reverse=True):
        text = re.sub(rf"(?<![\w./+-]){re.escape(value)}(?![\w./+-])", MASK, text)
    return text


def line_values(text: str, options: tuple[str, ...] = ()) -> set[str]:
    """The secret values of a pasted command line (a shell line or an LLM(...) call)."""
    if re.match(r"^\s*(\w+\s*=\s*)?(vllm\.)?LLM\s*\(", text):
        return values_in_call(text)
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        words = shlex.split(joined, comments=True)
    except ValueError:
        words = joined.split()
    return values_in_words(words, options)


def mask_line(text: str, options: tuple[str, ...] = ()) -> str:
    """A pasted command line with its secrets masked."""
    return mask(text, line_values(text, options))


def _unquoted(value: str) -> str:
    """A Hydra-quoted value ('...', as plan.from_command.hydra_quoted writes it) as the text it stands for."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def mask_arguments(arguments: list[str]) -> list[str]:
    """A command's arguments (Hydra overrides) as oneknob records and prints them: a from_command line's secrets
    masked, and the value of a secret-named key (never a knob: plan.checks refuses those)."""
    masked = []
    for argument in arguments:
        key, sep, value = argument.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in ("from_command", "from_command.line"):
            argument = f"{key}={mask(value, line_values(_unquoted(value)))}"
        elif sep and secret_name(bare.rsplit(".", 1)[-1]):
            argument = f"{key}={MASK}"
        masked.append(argument)
    return masked
