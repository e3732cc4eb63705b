"""The windows of `gemma4 perplexity` (tools/cmd_perplexity.c), for the Python references."""


def windows(n_tokens, ctx, stride):
    """(b, e, first) per window: it reads <bos> t[b:e] and scores t[first:e], each token once."""
    out, prev_end, b = [], 0, 0
    while prev_end < n_tokens:
        e = min(b + ctx - 1, n_tokens)
        out.append((b, e, max(b, prev_end)))
        prev_end = e
        b += stride
    return out
