"""Prompt layout: prefix + chunks + suffix, each tokenized on its own.

    prefix = BOS + instruction            (prefilled once, shared by every chunk's cache)
    chunk  = "Passage: <text>\\n\\n"        (one per retrieved passage; KV precomputed behind the prefix)
    suffix = "Question: <q>\\nAnswer:"      (the only part prefilled at query time in turbo mode)

The prompt is the concatenation of these token lists, never a re-tokenized string, so `full` and `turbo`
see exactly the same token ids and differ only in cache reuse. A chunk's tokens cannot depend on its
place in the prompt (no "Passage 3:" numbering), or its cache could not be reused.

Models with a chat template put the chunks inside the user turn: the template is rendered around a
sentinel and split there, giving the text before the user content (joined to the prefix) and after it
(joined to the suffix).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MEMO_PASSAGES = 8192  # passages whose token ids are remembered (a few MB)
# Asks for a sentence and names the reply for a question the passages do not answer, the two behaviours the
# shipped fine-tune is trained on (turborag_research/mix.py); an untuned model gets the same instruction.
ABSTAIN = "The passages do not say."
INSTRUCTION = (
    f"Answer the question in one sentence, using only the passages below. "
    f"If they do not contain the answer, reply: {ABSTAIN}\n\n"
)
_SENTINEL = "\x00TURBORAG_USER_CONTENT\x00"


def answer_ids(tokenizer, answer: str) -> list[int]:
    """Target tokens: ' <answer>' then a newline, the end-of-answer mark the QA decoder stops on (how the
    fine-tune tokenizes a target, train/finetune.py)."""
    return list(tokenizer(f" {answer.strip()}\n", add_special_tokens=False)["input_ids"])


def abstain_ids(tokenizer, spaced: bool = True) -> list[int]:
    """The abstention reply as the model writes it before stopping. `spaced`: as a fine-tune trained on
    `answer_ids` targets writes it (' The passages ...'), less the closing newline unless the tokenizer merged
    it into the last word (Llama 3 has ".\n"); otherwise as an untuned chat model begins its turn, without
    the space: scored with the space, such a model's reply is about e^-17 less likely than as it writes it."""
    if not spaced:
        return list(tokenizer(ABSTAIN, add_special_tokens=False)["input_ids"])
    reply = answer_ids(tokenizer, ABSTAIN)
    return reply[:-1] if not tokenizer.decode(reply[-1:]).strip() else reply


@dataclass
class Prompt:
    prefix: list[int]
    chunks: list[list[int]]
    suffix: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prefix + [t for c in self.chunks for t in c] + self.suffix

    @property
    def context_tokens(self) -> int:
        return sum(len(c) for c in self.chunks)


class PromptLayout:
    """Turns (question, passages) into token lists for one tokenizer."""

    def __init__(self, tokenizer, template: str = "auto", instruction: str = INSTRUCTION):
        if template not in ("auto", "plain", "chat"):
            raise ValueError(f"unknown template {template!r}: use auto, plain or chat")
        has_chat = bool(getattr(tokenizer, "chat_template", None))
        if template == "chat" and not has_chat:
            raise ValueError("--template chat: this tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template = "chat" if template == "chat" or (template == "auto" and has_chat) else "plain"
        self.instruction = instruction
        if self.template == "chat":
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
            )
            self.before, self.after = rendered.split(_SENTINEL)
        else:
            bos = tokenizer.bos_token or ""
            self.before, self.after = bos, ""
        self._prefix = self._encode(self.before + self.instruction)
        self._memo: OrderedDict[str, list[int]] = OrderedDict()  # passage text -> chunk ids (LRU)
        # a server builds prompts on its model thread and, to refuse one that cannot fit before queueing
        # it, on a request's thread: the memo is read and evicted under a lock
        self._memo_lock = threading.Lock()

    def _encode(self, text: str) -> list[int]:
        # Special tokens (BOS, turn markers) are written in the text, so the tokenizer must not add more.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prefix_ids(self) -> list[int]:
        return list(self._prefix)

    def chunk_ids(self, text: str) -> list[int]:
        return self._encode(f"Passage: {text.strip()}\n\n")

    def suffix_ids(self, question: str) -> list[int]:
        cue = "\nAnswer:" if self.template == "plain" else ""
        return self._encode(f"Question: {question.strip()}{cue}" + self.after)

    def chunks_ids(self, texts: list[str]) -> list[list[int]]:
        """`chunk_ids` of many passages: remembered ones from the memo, the rest in one tokenizer call.

        Retrieved passages recur (that is what makes their caches worth keeping), and tokenizing 8k tokens
        of them costs ~8 ms on a 2-core CPU, as much as reading their caches; so the ids of the last
        `MEMO_PASSAGES` passages are kept (LRU). The ids are a pure function of the text.
        """
        with self._memo_lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._memo))
            if todo:
                enc = self.tokenizer([f"Passage: {t.strip()}\n\n" for t in todo], add_special_tokens=False)
                for text, ids in zip(todo, enc["input_ids"]):
                    self._memo[text] = list(ids)
            out = []
            for text in texts:
                self._memo.move_to_end(text)
                out.append(list(self._memo[text]))
            while len(self._memo) > MEMO_PASSAGES:
                self._memo.popitem(last=False)
            return out

    def build(self, question: str, passages: list[str]) -> Prompt:
        return Prompt(self.prefix_ids(), self.chunks_ids(passages), self.suffix_ids(question))
