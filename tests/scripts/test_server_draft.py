#!/usr/bin/env python3
"""Speculative decoding through `gemma4 serve --draft` (issue 29), on the
bundled model and its trained drafter (models/tiny, models/tiny-assistant),
the CPU's exact path (batch-invariant).

Checked with the official `openai` client:
  - 16 greedy chat requests, each first alone with "speculative": false (no
    drafting), then all 16 at once with drafting (each decoding sequence
    drafts and verifies inside the batched steps): every reply's token ids
    equal its own undrafted run;
  - usage.speculative (draft_tokens, accepted_tokens, rounds,
    mean_accepted_length) on drafted replies, absent on opted-out ones;
  - /metrics: gemma4_spec_decode_* rounds, drafts and acceptance per
    position, adding up to the replies' usage, mean accepted length > 1;
  - /v1/completions and /v1/responses take "speculative": false too, and a
    non-boolean value is a 400 naming the field.
Needs (PyPI): openai.
"""
import os
import sys
import tempfile
import threading
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, summary  # noqa: E402
from serve_process import SANITIZER_REPORTS, ServeProcess  # noqa: E402

BIN = os.environ.get("G4_BIN", "build/gemma4")
SOURCE = os.environ.get("G4_SOURCE", ".")
TMP = os.environ.get("G4_TMP", tempfile.gettempdir())
MODEL = os.path.join(SOURCE, "models", "tiny")
DRAFTER = os.path.join(SOURCE, "models", "tiny-assistant")
N = 16
DRAFT_MAX = 3

QUESTIONS = [
    "In the beginning what did God create?",
    "And what was upon the face of the deep?",
    "What did he call the light?",
    "Tell me of the firmament.",
    "What did the waters bring forth?",
    "Who was made in his image?",
    "What was given for meat?",
    "Tell me of the seventh day.",
    "What river went out of Eden?",
    "What was the name of the first man?",
    "Who spake unto Moses?",
    "What are the poor in spirit promised?",
    "Say the first words of the book.",
    "What was the light divided from?",
    "What did God see?",
    "Tell me of the garden.",
]


class Server(ServeProcess):
    def __init__(self, *args):
        super().__init__(BIN, MODEL, ["--threads", "2", "--precision", "exact", "--quiet", "--max-seqs", str(N), *args],
                         os.path.join(TMP, "test_server_draft.log"))
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=300)

    def metrics(self):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self):
        rc, text, _ = super().stop()
        check(rc == 0, "server exit status %s" % rc, text[-2000:])
        for bad in SANITIZER_REPORTS:
            check(bad not in text, "server stderr reports " + bad, text[-3000:])


def ask(server, question, speculative):
    extra = {"return_token_ids": True}
    if not speculative:
        extra["speculative"] = False
    r = server.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": question}], max_tokens=32, temperature=0,
        extra_body=extra)
    ch = r.choices[0]
    return {
        "ids": (ch.model_extra or {}).get("token_ids") or [],
        "content": ch.message.content,
        "speculative": (r.usage.model_extra or {}).get("speculative"),
    }


def main():
    srv = Server("--draft", DRAFTER, "--draft-max", str(DRAFT_MAX), "--draft-max-batch", str(N))
    try:
        alone = [ask(srv, q, False) for q in QUESTIONS]
        check(all(len(a["ids"]) > 0 for a in alone), "undrafted replies have token ids")
        check(all(a["speculative"] is None for a in alone), "no usage.speculative on opted-out replies",
              [a["speculative"] for a in alone])
        m0 = srv.metrics()
        check(m0.get("gemma4_spec_decode_rounds_total") == 0 and m0.get("gemma4_spec_decode_draft_max") == DRAFT_MAX,
              "opted-out requests drafted nothing (rounds %r, draft_max %r)" % (
                  m0.get("gemma4_spec_decode_rounds_total"), m0.get("gemma4_spec_decode_draft_max")))

        drafted = [None] * N
        errors = []

        def worker(i):
            try:
                drafted[i] = ask(srv, QUESTIONS[i], True)
            except Exception as exc:  # reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(not errors, "16 concurrent drafted requests answered", errors)
        same = sum(1 for i in range(N) if drafted[i] and drafted[i]["ids"] == alone[i]["ids"])
        check(same == N, "%d/%d concurrent drafted replies have exactly the ids of their undrafted run alone" % (same, N),
              [(i, alone[i]["ids"], drafted[i] and drafted[i]["ids"]) for i in range(N)
               if not drafted[i] or drafted[i]["ids"] != alone[i]["ids"]][:2])
        usage = [d["speculative"] for d in drafted if d and d["speculative"]]
        check(len(usage) == N, "usage.speculative on every drafted reply (%d of %d)" % (len(usage), N))
        proposed = sum(u["draft_tokens"] for u in usage)
        kept = sum(u["accepted_tokens"] for u in usage)
        rounds = sum(u["rounds"] for u in usage)
        check(all(abs(u["mean_accepted_length"] - (u["accepted_tokens"] + u["rounds"]) / u["rounds"]) < 1e-9
                  for u in usage), "usage mean_accepted_length = (accepted + rounds) / rounds")
        m = srv.metrics()
        check(m.get("gemma4_spec_decode_rounds_total") == rounds and
              m.get("gemma4_spec_decode_draft_tokens_total") == proposed and
              m.get("gemma4_spec_decode_accepted_tokens_total") == kept,
              "/metrics rounds/drafts/kept %r/%r/%r = the replies' usage %d/%d/%d" % (
                  m.get("gemma4_spec_decode_rounds_total"), m.get("gemma4_spec_decode_draft_tokens_total"),
                  m.get("gemma4_spec_decode_accepted_tokens_total"), rounds, proposed, kept))
        by_pos = [m.get('gemma4_spec_decode_draft_tokens_by_position_total{position="%d"}' % i) for i in range(DRAFT_MAX)]
        kept_pos = [m.get('gemma4_spec_decode_accepted_tokens_by_position_total{position="%d"}' % i)
                    for i in range(DRAFT_MAX)]
        rate = [m.get('gemma4_spec_decode_acceptance_rate{position="%d"}' % i) for i in range(DRAFT_MAX)]
        check(None not in by_pos and sum(by_pos) == proposed and sum(kept_pos) == kept,
              "per-position drafts %r and kept %r add up" % (by_pos, kept_pos))
        check(by_pos[0] == rounds, "every round drafts a first token (%r of %d)" % (by_pos[0], rounds))
        check(all(abs(rate[i] - kept_pos[i] / by_pos[i]) < 1e-6 for i in range(DRAFT_MAX) if by_pos[i]),
              "acceptance rate by position = kept / drafted: %r" % rate)
        mean = m.get("gemma4_spec_decode_mean_accepted_length")
        check(mean is not None and 1 < mean <= DRAFT_MAX + 1 and abs(mean - (kept + rounds) / rounds) < 1e-6,
              "mean accepted length %r" % mean)
        check(0 < kept < proposed, "some drafts kept, some rejected (%d of %d)" % (kept, proposed))
        print("16 concurrent drafted requests: %d/%d identical to alone; %d rounds, %d of %d drafts kept "
              "(by position %s), mean accepted length %.2f" % (same, N, rounds, kept, proposed,
                                                                " ".join("%.2f" % r for r in rate), mean))

        # the other endpoints take the opt-out too
        c = srv.client.completions.create(model="tiny", prompt="In the beginning", max_tokens=16, temperature=0,
                                          extra_body={"speculative": False})
        check(not (c.usage.model_extra or {}).get("speculative"), "completions: speculative false drafts nothing")
        c2 = srv.client.completions.create(model="tiny", prompt="In the beginning", max_tokens=16, temperature=0)
        check(c2.choices[0].text == c.choices[0].text and (c2.usage.model_extra or {}).get("speculative"),
              "completions: drafted text equals the undrafted one, with usage.speculative")
        r1 = srv.client.responses.create(model="tiny", input="What did God create?", max_output_tokens=16,
                                         temperature=0, extra_body={"speculative": False})
        r2 = srv.client.responses.create(model="tiny", input="What did God create?", max_output_tokens=16,
                                         temperature=0)
        check(r1.output_text == r2.output_text, "responses: drafted text equals the undrafted one")
        check(not (r1.usage.model_extra or {}).get("speculative") and (r2.usage.model_extra or {}).get("speculative"),
              "responses: usage.speculative only where drafted")
        try:
            srv.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, extra_body={"speculative": "yes"})
            check(False, "a non-boolean speculative is refused")
        except openai.BadRequestError as exc:
            check("speculative" in str(exc), "a non-boolean speculative is a 400 naming it", str(exc))
    finally:
        srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
