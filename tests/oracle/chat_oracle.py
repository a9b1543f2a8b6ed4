"""Oracle for flotilla's chat data pipeline (`data=chat`): what Hugging Face transformers renders
and tokenizes for each conversation of a JSONL file, and which tokens carry loss.

usage:
  chat_oracle.py --tokenizer DIR [--tokenizer DIR2 ...] --data FILE
                 [--train-on assistant|all|last_assistant]
                 [--messages-key KEY] [--sharegpt] [--add-generation-prompt] [--show]
                 [--generation-template FILE]

DIR is a Hugging Face tokenizer directory (tests/oracle/make_chat_tokenizers.py writes tiny ones);
FILE has one JSON object per line. Prints one JSON object per conversation on stdout:

  {"line": N, "text": T, "input_ids": [...], "trained": [0/1 per token],
   "mask": "all" | "prefixes" | "markers"}
  {"line": N, "error": MESSAGE}
  {"line": N, "error": MESSAGE, "kind": "raised" | "render"}

N is the 1-based line number in FILE (blank lines are skipped but counted). A tokenizer directory
without a chat template is an error of the whole run (exit status 1, nothing on stdout). With
several --tokenizer options, FILE is processed with each in turn (one Python start-up for all),
and every line also has "tokenizer": DIR.

"kind" says where an error of a render came from: "raised" when the template called
raise_exception(MESSAGE) (a reader of the template must stop with MESSAGE), "render" for any other
error of Jinja or Python while rendering (an undefined attribute, str + list, iterating None ...:
a reader must stop too, though its words are its own). Errors of the rules below (no 'KEY' list,
no assistant turn, not prefix-stable) have no "kind".

  T         = tokenizer.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=--add-generation-prompt)
  input_ids = tokenizer(T, add_special_tokens=False)["input_ids"]

Messages: the list under --messages-key ("messages"; "conversations" with --sharegpt). With
--sharegpt each turn is {"from": F, "value": V} and becomes {"role": R, "content": V} with
human -> user, gpt -> assistant, system -> system; any other "from" is an error
("unknown ShareGPT role 'F'"). A line without the key, or whose value is not a list, is an error
("no 'KEY' list").

The trained mask (the rule flotilla implements; render(m, g) below is
apply_chat_template(m, tokenize=False, add_generation_prompt=g)):

  all             every token 1.
  assistant       for each message i whose role is "assistant" (the message's role, whatever the
                  template writes, e.g. Gemma's "model"):
                    p = render(messages[:i], True); start = len(p). If T does not start with p:
                      error "not prefix-stable".
                    q = render(messages[:i+1], False); end = length of the longest common prefix
                      of q and T (so an end-of-turn marker the template writes after the content
                      is included, and an EOS a template writes only at the very end, as Phi-3's
                      does, is not counted for earlier turns), except that the prefix never ends
                      inside an added token: when it would end strictly inside the span of an
                      added (special) token of T's or of q's tokenization, end is moved back to
                      that span's start (repeatedly, should that land inside another).
                  A token is trained (1) when the start of its character span in T (the fast
                  tokenizer's offset mapping) lies in some [start, end); otherwise 0.
  last_assistant  the same, for the last message whose role is "assistant" only (it need not be
                  the last message); only that turn's prefix is checked for stability.

  Not prefix-stable: when T does not start with some turn's p, the turns are found by markers
  instead ("mask": "markers"). Every assistant message's content must be a string (else the error
  "not prefix-stable"); M = messages with assistant message i's content replaced by the marker
  "\ue000flotilla-turn-{i}\ue001", R = render(M, False). R with each marker read as a lazy
  capture of any text, everything else literal, must match the whole of T (else the error "not
  prefix-stable"); capture i is where message i's content lies in T, [cs, ce). For each trained
  turn whose marker R holds: q = render(M[:i+1], False), after = q past marker i; end = ce + the
  common prefix length of after and T[ce:], moved back out of added tokens as above (of T, and of
  T[:ce] + after). A token is trained when its character span overlaps some [cs, end) (so a
  Metaspace "▁word" that begins at the space before a content is trained, as transformers'
  {% generation %} masks take it).

  Under assistant and last_assistant a conversation with no assistant message is the error
  "no assistant turn". When a render (the full one or any prefix) raises, the line is
  {"line": N, "error": str(exception)} -- for a template's raise_exception(msg), msg itself.
  Errors are checked in this order: messages list, full render, no assistant turn, then each
  assistant turn in order (its prefix render, stability, its own render).

Why the added-token clause: Phi-3 writes "<|end|>\n" after every turn and its EOS
"<|endoftext|>" only at the very end, so for an earlier turn q ends "<|end|>\n<|endoftext|>" where
T goes on "<|end|>\n<|user|>"; the characters "<|" are common to both, and a bare character-level
prefix would end two characters into "<|user|>" and train that token. Added tokens are single
symbols to the tokenizer, so the common prefix is taken over them as single symbols too. (The
added tokens are those of the tokenizer's added vocabulary, tokenizer.json's "added_tokens".)

Notes, checked on the tiny tokenizers of make_chat_tokenizers.py:
  - Offsets are character (not byte) offsets into T for every kind of token: special/added tokens
    get their own span, the byte-level pieces of one multi-byte character (Llama 3, Qwen2.5) and
    the <0xXX> byte-fallback tokens of one character (Mistral, Gemma, Phi-3, Llama 2) all start
    at that character, and a Metaspace piece "▁word" starts at the space it stands for.
  - A token that straddles `start` (begins in the template's text, ends in the content) starts
    before `start` and is therefore not trained, and one that straddles `end` is trained; neither
    happens in the fixtures with the tiny tokenizers (the only moved-back ends are Phi-3's).
  - Offsets and lengths here are in characters (Python strings); the Rust tokenizers crate's
    offsets are byte offsets, which give the same mask when lengths are taken in bytes too.
  - transformers tokenizes special-token text inside message content (e.g. "<|im_start|>") as the
    special token; so does a reader of tokenizer.json.
  - Mistral 7B Instruct v0.3's template puts the system message into the *last* user turn only
    when that turn is the last message, so a conversation with a system message that ends with an
    assistant turn renders without the system prompt, and its prefix renders (which end with that
    user turn) carry it: such conversations are "not prefix-stable" under assistant masking.

--generation-template FILE: the same template with {% generation %} ... {% endgeneration %} around
each assistant reply (an independent oracle of the mask): each line also carries
"generation_mask", transformers' assistant_masks of apply_chat_template(messages,
chat_template=FILE, tokenize=True, return_dict=True, return_assistant_tokens_mask=True), whose
input_ids must equal input_ids above.

--show prints, instead of JSON, each text with trained spans bracketed as [[...]] (the exact
token spans, for checking masks by eye).
"""

import argparse
import bisect
import json
import os
import re
import sys

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


class ConversationError(Exception):
    pass


def load_messages(record, key, sharegpt):
    turns = record.get(key) if isinstance(record, dict) else None
    if not isinstance(turns, list):
        raise ConversationError(f"no '{key}' list")
    if not sharegpt:
        return turns
    out = []
    for t in turns:
        who = t.get("from") if isinstance(t, dict) else None
        if who not in SHAREGPT_ROLES:
            raise ConversationError(f"unknown ShareGPT role '{who}'")
        out.append({"role": SHAREGPT_ROLES[who], "content": t.get("value")})
    return out


def common_prefix_len(a, b):
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    lo, hi = 0, min(len(a), len(b))  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def added_spans(tok, ids, offsets):
    """Character spans of the added tokens in one encoding."""
    added = tok.added_tokens_decoder
    return [o for i, o in zip(ids, offsets) if i in added]


def turn_end(tok, upto, text, text_added, n=None):
    """The common prefix length of `upto` and `text` (or `n`, a length they share), never ending
    inside an added token."""
    if n is None:
        n = common_prefix_len(upto, text)
    spans = list(text_added)
    if n < len(upto):  # no span of `upto` can end past n otherwise
        enc = tok(upto, add_special_tokens=False, return_offsets_mapping=True)
        spans += added_spans(tok, enc["input_ids"], enc["offset_mapping"])
    inside = [a for a, b in spans if a < n < b]
    while inside:  # moving back may land inside another span (the two tokenizations may differ)
        n = min(inside)
        inside = [a for a, b in spans if a < n < b]
    return n


class RenderError(ConversationError):
    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def render(tok, messages, generation_prompt):
    from jinja2.exceptions import TemplateError

    try:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # the template's own errors (raise_exception) and Jinja's
        # raise_exception raises TemplateError itself; Jinja's own errors are its subclasses.
        raise RenderError(str(e), "raised" if type(e) is TemplateError else "render") from e


def assistant_spans(tok, messages, text, text_added, which):
    """[start, end) character spans of the assistant turns (all of them, or the last one), and
    how they were found ("prefixes" or "markers")."""
    idx = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
    if not idx:
        raise ConversationError("no assistant turn")
    if which == "last_assistant":
        idx = idx[-1:]
    spans = []
    for i in idx:
        prefix = render(tok, messages[:i], True)
        if not text.startswith(prefix):
            return marker_spans(tok, messages, text, text_added, idx), "markers"
        upto = render(tok, messages[: i + 1], False)
        spans.append((len(prefix), turn_end(tok, upto, text, text_added)))
    return spans, "prefixes"


def marker(i):
    return f"\ue000flotilla-turn-{i}\ue001"


def marker_spans(tok, messages, text, text_added, idx):
    assistants = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
    if any(not isinstance(messages[i].get("content"), str) for i in assistants):
        raise ConversationError("not prefix-stable")
    marked = [dict(m, content=marker(i)) if i in assistants else m for i, m in enumerate(messages)]
    rendered = render(tok, marked, False)
    order = [i for i in assistants if marker(i) in rendered]
    pattern = re.escape(rendered)
    for i in order:
        pattern = pattern.replace(re.escape(marker(i)), f"(?P<m{i}>.*?)", 1)
    match = re.fullmatch(pattern, text, re.DOTALL)
    if match is None:
        raise ConversationError("not prefix-stable")
    spans = []
    for i in idx:
        if i not in order:
            continue
        start, content_end = match.span(f"m{i}")
        upto = render(tok, marked[: i + 1], False)
        after = upto[upto.index(marker(i)) + len(marker(i)) :]
        alone = text[:content_end] + after
        n = content_end + common_prefix_len(after, text[content_end:])
        spans.append((start, turn_end(tok, alone, text, text_added, n)))
    return spans


def overlap_mask(offsets, spans):
    """1 for each token whose character span overlaps one of the [start, end) spans, else 0."""
    return [int(any(s < end and e > start for start, end in spans)) for s, e in offsets]


def trained_mask(offsets, spans):
    """1 for each token whose start offset lies in one of the [start, end) spans, else 0."""
    starts = [o[0] for o in offsets]
    if starts != sorted(starts):  # not seen with these tokenizers; the plain definition then
        return [int(any(s <= x < e for s, e in spans)) for x in starts]
    mask = bytearray(len(starts))
    for s, e in spans:
        i, j = bisect.bisect_left(starts, s), bisect.bisect_left(starts, e)
        mask[i:j] = b"\x01" * max(0, j - i)
    return list(mask)


def process(tok, record, args):
    messages = load_messages(record, args.messages_key, args.sharegpt)
    text = render(tok, messages, args.add_generation_prompt)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    if args.train_on == "all":
        trained, how = [1] * len(ids), "all"
    else:
        spans, how = assistant_spans(tok, messages, text, added_spans(tok, ids, offsets), args.train_on)
        trained = (overlap_mask if how == "markers" else trained_mask)(offsets, spans)
    extra = {"mask": how}
    if args.generation_template:
        out = tok.apply_chat_template(
            messages,
            chat_template=args.generation_template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        if list(out["input_ids"]) != list(ids):
            sys.exit("chat_oracle: the --generation-template renders other ids than the template")
        extra["generation_mask"] = list(out["assistant_masks"])
    return text, ids, offsets, trained, extra


def show(text, offsets, trained):
    """The text with the character spans of trained tokens bracketed [[...]]."""
    out, pos, inside = [], 0, False
    for (s, e), t in zip(offsets, trained):
        if s < pos:  # several tokens of one character (bytes) share its span
            continue
        out.append(text[pos:s])
        if t and not inside:
            out.append("[[")
            inside = True
        elif not t and inside:
            out.append("]]")
            inside = False
        out.append(text[s:e])
        pos = e
    if inside:
        out.append("]]")
    out.append(text[pos:])
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, action="append", help="Hugging Face tokenizer directory")
    ap.add_argument("--data", required=True, help="JSONL file of conversations")
    ap.add_argument("--train-on", choices=["assistant", "all", "last_assistant"], default="assistant")
    ap.add_argument("--messages-key", default=None, help='"messages" ("conversations" with --sharegpt)')
    ap.add_argument("--sharegpt", action="store_true", help="turns are {from, value} (ShareGPT)")
    ap.add_argument("--add-generation-prompt", action="store_true")
    ap.add_argument("--show", action="store_true", help="print texts with trained spans bracketed")
    ap.add_argument("--generation-template", default=None, help="the template with {% generation %} marks")
    args = ap.parse_args()
    if args.generation_template:
        with open(args.generation_template, encoding="utf-8") as f:
            args.generation_template = f.read()
    if args.messages_key is None:
        args.messages_key = "conversations" if args.sharegpt else "messages"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from transformers import AutoTokenizer

    toks = []
    for path in args.tokenizer:
        if not os.path.isdir(path):
            sys.exit(f"chat_oracle: no tokenizer directory {path}")
        tok = AutoTokenizer.from_pretrained(path)
        if tok.chat_template is None:
            sys.exit(f"chat_oracle: {path} has no chat template")
        if not tok.is_fast:
            sys.exit(f"chat_oracle: {path} did not load as a fast tokenizer (offsets need one)")
        toks.append((path, tok))
    for path, tok in toks:
        run(tok, path if len(toks) > 1 else None, args)


def run(tok, name, args):
    tagged = {} if name is None else {"tokenizer": name}
    with open(args.data, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"chat_oracle: {args.data}:{n}: not JSON: {e}")
            try:
                text, ids, offsets, trained, extra = process(tok, record, args)
            except ConversationError as e:
                if args.show:
                    print(f"--- line {n}: error: {e}")
                else:
                    kind = {"kind": e.kind} if isinstance(e, RenderError) else {}
                    print(json.dumps({"line": n, "error": str(e), **kind, **tagged}, ensure_ascii=False))
                continue
            if args.show:
                print(f"--- line {n}: {len(ids)} tokens, {sum(trained)} trained")
                print(show(text, offsets, trained))
            else:
                line = {"line": n, "text": text, "input_ids": ids, "trained": trained, **extra, **tagged}
                print(json.dumps(line, ensure_ascii=False))


if __name__ == "__main__":
    main()
