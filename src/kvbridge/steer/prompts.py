"""Prompts, guides and packs as the steering runner needs them: a prefix whose cache is edited and
the live ids fed after it.

A :class:`Scenario` is ``prefix_ids`` (prefilled into the cache the method edits), ``live_ids``
(fed after it, at least one token) and the default edited positions ``edit`` of the prefix:

- a plain prompt (:func:`prompt_scenario`): the prompt's ids but the last are the prefix; the
  last token is fed live (the hand-off convention of :mod:`kvbridge.handoff`), and the edited
  position is the last cached one;
- a guide + prompt (:func:`guide_scenario`): the guide is the ghost of the exact-token split
  (``ghost + live == joint`` asserted, :mod:`kvbridge.prefix.splits`), every guide position but the
  tokenizer's leading special tokens is edited. With a chat template the guide is a system turn
  (rendered by the template: the text up to the user turn), else the guide text and a newline.

The visible form of a guided prompt is :attr:`Scenario.joint` (guide and prompt as one visible text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbridge.errors import KVBridgeError
from kvbridge.steer.pairs import encode_text, has_chat_template


@dataclass(frozen=True)
class Scenario:
    prefix_ids: tuple
    live_ids: tuple
    edit: tuple  # (start, stop) in the prefix
    text: str  # the whole visible text
    kind: str  # "prompt" | "guide"
    guide_text: str = ""

    @property
    def joint(self) -> tuple:
        return self.prefix_ids + self.live_ids


def chat_mode(tokenizer: Any, chat: bool | None) -> bool:
    if chat is None:
        return has_chat_template(tokenizer)
    if chat and not has_chat_template(tokenizer):
        raise KVBridgeError("--chat: this tokenizer has no chat template", "pass --no-chat")
    return bool(chat)


def prompt_text(tokenizer: Any, prompt: str, chat: bool) -> str:
    """The visible text of a prompt (a user turn with the assistant header under ``chat``)."""
    if not prompt.strip():
        raise KVBridgeError("the prompt is empty", "pass a non-empty --prompt TEXT (or @FILE)")
    if chat:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    return prompt


def prompt_scenario(tokenizer: Any, prompt: str, *, chat: bool = False) -> Scenario:
    text = prompt_text(tokenizer, prompt, chat)
    ids = tuple(encode_text(tokenizer, text))
    if len(ids) < 2:
        raise KVBridgeError(
            f"the prompt encodes to {len(ids)} token(s); steering edits the cache of all but the last",
            "pass a prompt of at least two tokens",
        )
    return Scenario(ids[:-1], ids[-1:], (len(ids) - 2, len(ids) - 1), text, "prompt")


def guide_texts(tokenizer: Any, guide: str, prompt: str, *, chat: bool) -> tuple[str, str, str]:
    """``(guide_text, live_text, sep)`` whose concatenation is the visible guided prompt."""
    if not guide.strip():
        raise KVBridgeError("the guide (instruction) is empty", "pass a non-empty --guide / --instruction")
    if not prompt.strip():
        raise KVBridgeError("the prompt is empty", "pass a non-empty --prompt TEXT (or @FILE)")
    if not chat:
        return guide, prompt, "\n"
    system = {"role": "system", "content": guide}
    full = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    head = tokenizer.apply_chat_template([system], add_generation_prompt=False, tokenize=False)
    if not full.startswith(head) or len(head) >= len(full):
        raise KVBridgeError(
            "the chat template does not render the system turn as a prefix of the conversation",
            "pass --no-chat and write the guide and prompt as plain text",
        )
    return head, full[len(head) :], ""


def guide_scenario(tokenizer: Any, guide: str, prompt: str, *, chat: bool = False) -> Scenario:
    """The guide as the prefix (exact-token split), the prompt live."""
    from kvbridge.prefix.splits import exact_split

    g, live, sep = guide_texts(tokenizer, guide, prompt, chat=chat)
    scenario = split_scenario(*exact_split(tokenizer, g, live, sep), g + sep + live)
    if scenario.edit[0] >= scenario.edit[1]:
        raise KVBridgeError("the guide has no tokens besides special tokens", "pass a longer guide")
    if not scenario.live_ids:
        raise KVBridgeError("the live part of the split is empty", "pass a non-empty prompt")
    return scenario


def split_scenario(report, split, text: str) -> Scenario:
    """The guide scenario of an exact-token split (``ghost`` the prefix, ``live`` fed after it): every
    ghost position edited but the tokenizer's leading special tokens."""
    n = len(report.special_prefix)
    keep = n if tuple(split.ghost[:n]) == report.special_prefix else 0
    return Scenario(tuple(split.ghost), tuple(split.live), (keep, len(split.ghost)), text, "guide", split.ghost_text)
