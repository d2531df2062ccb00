"""An LLM judge as a reward (`task.rewards[].judge`): each completion scored by a chat model
behind an OpenAI-compatible chat-completions endpoint (a vLLM or SGLang server, or a provider).

The judge is a reward function in TRL's convention and synchronous from the outside: one call
scores one batch. Its requests run on an event loop of its own, started with `asyncio.run` in the
calling thread (the trainer's: the step waits for the batch) and closed when the batch is scored;
a caller whose thread already runs a loop gets the batch run on a short-lived thread instead.
At most `concurrency` requests are in flight per process (under torchrun: that many per process).
A request that takes longer than `timeout_s`, cannot connect or gets HTTP 429 or 5xx is retried
after 2^n seconds (n = 0, 1, ...; a 429's Retry-After when that is longer, at most 60 s),
`max_retries` times; then the run ends in one line naming the judge and the row.

The score is `pattern`'s last match in the judge's answer (its first group if it has one) read as
a number; an answer without one (or with no finite number there) gives `unparsable` (None: the
reward skips the row) and is counted per step (`judge/<name>/unparsable_frac`).

The API key is read from the environment variable `api_key_env` when the judge is built and kept
in memory only: sent as `Authorization: Bearer`, never stored, logged or quoted in an error. It
is registered with `errors.register_secret`, so a server's answer quoting it (or a piece of it)
is masked before any message is cut, and run.json, the progress lines and the CLI's error line
mask it too.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import string
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from gspo_cli.errors import RunError, SpecError, redact, register_secret
from gspo_cli.metrics import judge_unparsable_key

FIXED = ("prompt", "completion")  # the template's placeholders besides the dataset's columns
PROBE_S = 5.0  # at most this long to learn that nothing listens at the judge's URL
MAX_RETRY_AFTER_S = 60.0


def make_judge(cfg: Any, name: str, where: str, columns: Iterable[str]) -> Judge:
    """The judge of one `JudgeConfig`, logged as `name`; `where` names its field in errors
    (task.rewards[i].judge), `columns` the dataset columns its rows carry. Checked now, before any
    model is built, each a one-line SpecError: httpx installed (the `judge` extra), the key's
    variable set, every template placeholder a column, something listening at the URL."""
    try:
        import httpx  # noqa: F401 - the optional extra, needed by every request
    except ImportError:
        raise SpecError(f"{where}: an LLM judge needs `pip install gspo-cli[judge]` (httpx)") from None
    key = None
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise SpecError(
                f"{where}.api_key_env: the environment variable {cfg.api_key_env} (the judge's API key) is not set"
            )
    check_template(cfg.template, set(columns), f"{where}.template")
    probe(cfg.url, f"{where}.url", min(PROBE_S, cfg.timeout_s))
    return Judge(cfg, name, key)


def check_template(template: str, columns: set[str], where: str) -> None:
    """SpecError naming the first placeholder of `template` that is neither {prompt},
    {completion} nor one of `columns`, or what makes it no format string."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise SpecError(f"{where}: not a format string ({err}); write a literal brace as {{{{ or }}}}") from None
    for field in fields:
        base = re.split(r"[.\[]", field, maxsplit=1)[0]
        if base not in (*FIXED, *columns):
            known = ", ".join(sorted(columns)) or "none"
            raise SpecError(
                f"{where}: {{{field}}} is no placeholder: use {{prompt}}, {{completion}} or a column "
                f"of the task's rows (theirs: {known}); write a literal brace as {{{{ or }}}}"
            )


def probe(url: str, where: str, seconds: float) -> None:
    """SpecError when nothing accepts a TCP connection at `url`'s host and port within `seconds`
    (refused, unknown host, no answer): a judge that cannot be reached fails now, not after retries."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"{where}: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        raise SpecError(f"{where}: {url}: {err}") from None
    try:
        socket.create_connection((parts.hostname, port), timeout=seconds).close()
    except ConnectionRefusedError:
        raise SpecError(f"{where}: {url} refuses connections (is the judge's server running?)") from None
    except socket.gaierror as err:
        raise SpecError(f"{where}: {url}: unknown host {parts.hostname} ({err.strerror})") from None
    except OSError as err:  # a timeout included
        why = f"no connection within {seconds:g} s" if isinstance(err, TimeoutError) else str(err) or type(err).__name__
        raise SpecError(f"{where}: {url} cannot be reached ({why})") from None


class Judge:
    """A reward function in TRL's convention: fn(prompts, completions, trainer_state, **columns)
    -> one float or None per completion. `unparsable`: {trainer_state.global_step: [answers the
    pattern missed, answers]}, what `record_unparsable` adds to the step's metrics."""

    def __init__(self, cfg: Any, name: str, key: str | None):
        self.cfg, self.name = cfg, name
        self.endpoint = cfg.url.rstrip("/") + "/chat/completions"
        self.pattern = re.compile(cfg.pattern)
        self._key = key
        if key:
            register_secret(key)  # masked in every message and file this process writes
        self._tls = None  # the TLS context every batch's client shares
        self.unparsable: dict[int, list[int]] = {}

    def __repr__(self) -> str:  # never the key
        return f"Judge({self.name!r}, {self.cfg.model} at {self.cfg.url})"

    def __call__(self, prompts, completions, completion_ids=None, trainer_state=None, **columns) -> list[float | None]:
        texts = [as_text(p) for p in prompts]
        users = [self.user_message(i, texts[i], as_text(c), columns) for i, c in enumerate(completions)]
        answers = run_batch(self._ask_all(users, texts))
        values = [self.value(a) for a in answers]
        tally = self.unparsable.setdefault(getattr(trainer_state, "global_step", 0), [0, 0])
        tally[0] += sum(v is None for v in values)
        tally[1] += len(values)
        return [self.cfg.unparsable if v is None else v for v in values]

    def user_message(self, i: int, prompt: str, completion: str, columns: dict[str, list]) -> str:
        """The template filled in for row `i`: its prompt and completion as text, its columns."""
        fields = {k: v[i] for k, v in columns.items()}
        try:
            return self.cfg.template.format_map({**fields, "prompt": prompt, "completion": completion})
        except KeyError as err:
            raise RunError(
                f"judge {self.name}: its template's {{{err.args[0]}}} is no column of the row whose prompt "
                f"starts {prompt[:40]!r} (columns: {', '.join(fields) or 'none'})"
            ) from None
        except (IndexError, AttributeError, ValueError, TypeError) as err:
            raise RunError(
                f"judge {self.name}: its template cannot be filled in for the row whose prompt starts "
                f"{prompt[:40]!r} ({type(err).__name__}: {err})"
            ) from None

    def value(self, answer: str) -> float | None:
        """The score in `answer`: the pattern's last match (its first group if it has one) as a
        finite number; None when there is none."""
        last = None
        for last in self.pattern.finditer(answer):  # noqa: B007 - the last one is the score
            pass
        if last is None:
            return None
        try:
            v = float(last.group(1) if self.pattern.groups else last.group(0))
        except (TypeError, ValueError):  # a group that did not take part, or no number
            return None
        return v if math.isfinite(v) else None

    async def _ask_all(self, users: list[str], texts: list[str]) -> list[str]:
        import httpx

        n = self.cfg.concurrency
        slots = asyncio.Semaphore(n)
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        if self._tls is None:  # built once: loading the CA certificates takes ~0.1 s per client
            self._tls = httpx.create_ssl_context()
        client = httpx.AsyncClient(headers=headers, limits=limits, timeout=self.cfg.timeout_s, verify=self._tls)
        async with client:
            tasks = [asyncio.ensure_future(self._ask(client, slots, u, t)) for u, t in zip(users, texts)]
            try:
                return list(await asyncio.gather(*tasks))
            finally:  # the first failure ends the batch: no request outlives it
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _ask(self, client, slots: asyncio.Semaphore, user: str, text: str) -> str:
        import httpx

        cfg = self.cfg
        messages = ([{"role": "system", "content": cfg.system}] if cfg.system else []) + [
            {"role": "user", "content": user}
        ]
        body = {"model": cfg.model, "messages": messages, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature}
        why = ""
        for attempt in range(cfg.max_retries + 1):
            wait = 2.0**attempt
            async with slots:  # held while the request is in flight, not while backing off
                try:
                    r = await asyncio.wait_for(client.post(self.endpoint, json=body), cfg.timeout_s)
                except (asyncio.TimeoutError, TimeoutError, httpx.TimeoutException):
                    why = f"no answer within {cfg.timeout_s:g} s"
                except httpx.TransportError as err:
                    why = f"{type(err).__name__}: {err}"
                else:
                    if r.status_code == 429 or r.status_code >= 500:
                        why = f"HTTP {r.status_code}"
                        wait = max(wait, retry_after(r.headers.get("retry-after")))
                    elif r.status_code >= 400:
                        hint = (
                            " (is `url` the API's base, e.g. http://127.0.0.1:8000/v1?)" if r.status_code == 404 else ""
                        )
                        raise self._error(text, f"HTTP {r.status_code}{hint}: {_first_line(redact(r.text))[:200]}")
                    else:
                        return self._content(r, text)
            if attempt < cfg.max_retries:
                await asyncio.sleep(wait)
        raise self._error(text, f"no answer after {cfg.max_retries + 1} tries (last: {why})")

    def _content(self, response, text: str) -> str:
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._error(text, "its answer is no chat completion (no choices[0].message.content)") from None
        return content if isinstance(content, str) else ""  # null content (a reasoning model's): unparsable

    def _error(self, text: str, what: str) -> RunError:
        # `what` was redacted before it was cut (a cut key is no longer found whole); this again
        return RunError(
            redact(f"judge {self.name} ({self.endpoint}): {what}, for the row whose prompt starts {text[:40]!r}")
        )


def as_text(x: Any) -> str:
    """A prompt or completion as the template shows it: text as it is; a list of messages (TRL's
    conversational form) as `role: content` lines, a lone assistant message as its content."""
    if isinstance(x, str):
        return x
    messages = list(x)
    if len(messages) == 1 and messages[0].get("role") == "assistant":
        return str(messages[0].get("content", ""))
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


def retry_after(header: str | None) -> float:
    """Seconds a 429's Retry-After asks for (0 when absent or a date), at most MAX_RETRY_AFTER_S."""
    try:
        return min(max(float(header), 0.0), MAX_RETRY_AFTER_S) if header else 0.0
    except ValueError:
        return 0.0


def run_batch(coro):
    """Run `coro` to completion on a fresh event loop: in this thread, or on a short-lived one
    when this thread already runs a loop (asyncio.run refuses to nest)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="gspo-judge") as pool:
        return pool.submit(asyncio.run, coro).result()


def record_unparsable(stats: Any, task: Any, step: int) -> None:
    """Add each LLM judge of `task`'s answers at training step `step` that its pattern found no
    score in to `stats` (a StepStats) as judge/<name>/unparsable_frac, a mean over its answers;
    read once, as are earlier steps' counts (evaluations'). A task without judges adds nothing."""
    for r in getattr(task, "rewards", None) or ():
        judge = getattr(r, "call", None)
        if isinstance(judge, Judge):
            missed, answers = judge.unparsable.pop(step, (0, 0))
            for s in [s for s in judge.unparsable if s < step]:
                del judge.unparsable[s]
            if answers:
                stats.mean(judge_unparsable_key(r.name), missed, answers)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]
