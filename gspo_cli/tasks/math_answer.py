r"""Final answers of math completions: extraction, normalisation, equivalence.

Extraction, in order (the first that finds something wins):

1. the last ``\boxed{...}`` (braces balanced);
2. with ``fallbacks``: the last "the (final) answer is X" (up to the end of the sentence or line);
3. with ``fallbacks``: the last line "Answer: X" (Markdown bold and ``$`` around it allowed).

Equivalence of a prediction with the gold answer:

- an **integer** gold (every AIME answer, every synthetic problem) needs a prediction that is
  a plain number equal to it: ``033``, ``33.``, ``33.0``, ``1,000`` and ``x = 33`` count; an
  expression such as ``5+5`` does not, or the synthetic task is solved by copying the question
  into the box (math-verify would accept it). This path never touches math-verify.
- any other gold goes through math-verify (``\frac{1}{2}`` = ``0.5``, ``3\sqrt{2}`` = ``\sqrt{18}``).

math-verify guards its work with ``signal.alarm``, which only works on the main thread; we
call it with its time-outs disabled everywhere (so a completion scores the same on any
thread) and protect ourselves instead: long answers and answers with huge or nested
exponents (``9^{9^{9}}`` runs sympy for minutes) are never handed to it.
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from gspo_cli.tasks.base import extract_boxed

MAX_ANSWER_CHARS = 200  # longer "answers" are not answers; and sympy time grows with length

# After "answer is": a $...$ span, else one token (trailing punctuation dropped later).
_ANSWER_IS = re.compile(r"answer\s+is\s*:?[\s*_]*(\$[^$\n]+\$|[^\s$]+)", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^[\s*#_]*answer[\s*_]*:[\s*_]*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_DEGREES = re.compile(r"(\^\{?\\circ\}?|°)$")
_ASSIGNMENT = re.compile(r"^[a-zA-Z]\s*=\s*(?=[^=])")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)$")
# An exponent whose literal has 5+ digits, or an exponent inside an exponent.
_BIG_EXPONENT = re.compile(r"(\^|\*\*)\s*\{?\s*\(?\s*\d{5,}")
_NESTED_EXPONENT = re.compile(r"(\^|\*\*)\s*(\{[^{}]*|\(?[\w.]+\)?\s*)(\^|\*\*)")


def extract_answer(text: str, fallbacks: bool = True) -> str | None:
    """The final answer in `text` as written (not normalised), or None if there is none."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if not fallbacks:
        return None
    for pattern in (_ANSWER_IS, _ANSWER_LINE):
        found = pattern.findall(text)
        if found:
            ans = _strip_markup(found[-1])
            if ans:
                return ans
    return None


def _strip_markup(ans: str) -> str:
    """Drop Markdown emphasis, trailing punctuation and enclosing ``$`` (in any nesting)."""
    prev = None
    while ans != prev:
        prev = ans
        ans = ans.strip().strip("*_").rstrip(".,;").strip()
        if len(ans) > 1 and ans[0] == ans[-1] == "$":
            ans = ans[1:-1]
    return ans


def normalize_answer(ans: str) -> str:
    """A canonical spelling for comparing and voting: integers as ``str(int)`` (``033``,
    ``1,000``, ``33.0``, ``x=33`` and ``33^\\circ`` become ``33``, ``1000``, ``33``, ``33``, ``33``);
    anything else with whitespace, ``$``, ``\\text{}`` wrappers and a trailing period removed."""
    s = ans.strip().rstrip(".").strip().strip("$").strip()
    s = _WRAPPER.sub(r"\1", s)
    for junk in ("\\!", "\\,", "\\;", "\\ ", "~", "\\left", "\\right"):
        s = s.replace(junk, "")
    s = "".join(s.split()).rstrip(".")
    s = _DEGREES.sub("", s)  # "45^\circ" is 45: AIME angles are asked for in degrees
    s = _ASSIGNMENT.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    num = _as_number(s)
    if num is not None and num == num.to_integral_value():
        return str(int(num))
    return s


def _as_number(s: str) -> Decimal | None:
    if not _NUMBER.match(s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def is_integer_answer(ans: str) -> bool:
    return re.fullmatch(r"-?\d+", normalize_answer(ans)) is not None


def answers_match(gold: str, pred: str | None) -> bool:
    """Whether `pred` is a correct final answer for `gold` (see the module docstring).

    Never raises: garbage is simply wrong.
    """
    if pred is None or not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return False
    g, p = normalize_answer(gold), normalize_answer(pred)
    if g == p:
        return True
    if re.fullmatch(r"-?\d+", g):
        num = _as_number(p)
        return num is not None and num == int(g)
    if _risky(p):
        return False
    return _math_verify(g, p)


def _risky(s: str) -> bool:
    return bool(_BIG_EXPONENT.search(s) or _NESTED_EXPONENT.search(s))


def _math_verify(gold: str, pred: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:  # an optional dependency in older installs: exact match only then
        return False
    try:
        gold_parsed = _parse_gold(gold)
        pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=None)
        # Argument order matters: math-verify is not symmetric (gold first).
        return bool(gold_parsed) and bool(pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=None)
    except Exception:  # noqa: BLE001 - a verifier never raises on garbage
        return False


@lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    from math_verify import parse

    _quiet_math_verify()
    return parse(f"\\boxed{{{gold}}}", parsing_timeout=None)


def _quiet_math_verify() -> None:
    # It logs a warning on the first call without a time-out; we provide our own guard.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
