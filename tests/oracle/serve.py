"""A warm interpreter for the tests' Python oracles (tests/common/python.rs drives it).

Importing torch and transformers 5 costs 6 to 14 s of CPU per interpreter, more than most
oracle calls compute. A test binary keeps a few of these servers and sends each call as one
JSON line on stdin:

    {"argv": ["SCRIPT", "ARG", ...] | ["-c", "CODE", "ARG", ...],
     "env": {"NAME": "VALUE", ...}, "cwd": "DIR" | null, "stdin": "TEXT"}

The server runs it as `python ARGV...` would (the script as `__main__`, `sys.argv` set, the
environment and working directory changed for the call) and answers one JSON line on its
protocol channel: {"code": EXIT_STATUS, "stdout": "...", "stderr": "..."}.

Between calls it puts back what a script may change for the next one: the environment, the
working directory, `sys.argv`, `sys.path`, the warning filters, the modules imported from
outside the interpreter's own trees, torch's default dtype, thread count, deterministic
mode, grad mode and its default generator's seed (the seed a fresh interpreter starts with),
so that a call sees what a fresh `python` would. It exits at the end of its input.
"""
import contextlib
import gc
import io
import json
import os
import runpy
import sys
import traceback
import warnings

# The protocol channel is a copy of the original stdout; file descriptor 1 then points at
# stderr, so that output written below Python (a C library, a child process) cannot corrupt it.
channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
requests = sys.stdin

try:  # the imports every oracle pays for; a venv without them still serves plain scripts
    import torch
    import transformers  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
except ImportError:
    torch = None


def torch_state():
    if torch is None:
        return None
    return (torch.get_default_dtype(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(), torch.is_grad_enabled())


def restore_torch(state, seed):
    if torch is None:
        return
    dtype, threads, deterministic, grad = state
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.set_grad_enabled(grad)
    torch.manual_seed(seed)


def text_stream(data=""):
    """A text stream with a byte buffer behind it, as sys.stdout and sys.stdin have."""
    stream = io.TextIOWrapper(io.BytesIO(data.encode("utf-8")), encoding="utf-8", newline="")
    return stream


def captured(stream):
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="replace")


def exit_code(e):
    """The status `python` exits with for SystemExit(e.code), printing a message as it does."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def run(request):
    argv = request["argv"]
    out, err = text_stream(), text_stream()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if argv[0] == "-c":
                sys.argv = ["-c"] + argv[2:]
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = list(argv)
                sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            code = exit_code(e)
        except BaseException:  # noqa: B902 - a failing script is an answer, not the server's end
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    return {"code": code, "stdout": captured(out), "stderr": captured(err)}


# Modules from outside the interpreter's own trees (an oracle's sibling, an example's `train`)
# are forgotten after each call: the next call may mean another file by the same name.
OWN_TREES = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})


def forget_modules_of_the_call(before):
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None)
        if file and not os.path.realpath(file).startswith(OWN_TREES):
            del sys.modules[name]


def main():
    seed = torch.initial_seed() if torch is not None else 0
    state = torch_state()
    for line in requests:
        request = json.loads(line)
        environ, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
        modules, filters = set(sys.modules), list(warnings.filters)
        stdin = sys.stdin
        try:
            os.environ.update(request.get("env") or {})
            if request.get("cwd"):
                os.chdir(request["cwd"])
            sys.stdin = text_stream(request.get("stdin") or "")
            sys.stdin.seek(0)
            answer = run(request)
        finally:
            sys.stdin = stdin
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environ)
            sys.path[:] = path
            warnings.filters[:] = filters
            forget_modules_of_the_call(modules)
            restore_torch(state, seed)
            gc.collect()
        channel.write(json.dumps(answer) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
