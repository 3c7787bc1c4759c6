"""One rank of a Python test job (see harness.py).

Pool mode (no arguments): hora.init(), report ready, then run the bodies named
on stdin one by one, each followed by a result line. ``--no-init``: the same
without hora.init() (each body runs its own init/shutdown). ``--once MODULE FN ARGS``:
run one body without calling hora.init() first (the body decides), then exit.
Results go to stdout as one line: MARK + JSON.
"""
import json
import os
import sys
import traceback

MARK = "@@HORA@@"
sys.path.insert(0, os.environ.get("HORA_TEST_DIR", os.path.dirname(os.path.abspath(__file__))))


def _report(ok, value=None, error=None):
    sys.stdout.write(MARK + json.dumps({"ok": ok, "value": value, "error": error}) + "\n")
    sys.stdout.flush()


def _call(module, fn, args):
    import importlib
    mod = importlib.import_module(module)
    return getattr(mod, fn)(int(os.environ["HORA_RANK"]), int(os.environ["HORA_SIZE"]), *args)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--once":
        try:
            value = _call(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
            _report(True, value)
        except BaseException:
            _report(False, error=traceback.format_exc())
            sys.stdout.flush()
            os._exit(1)
        return
    try:
        import hora.torch as hvd
        if "--no-init" not in sys.argv[1:]:
            hvd.init()
        _report(True)
    except BaseException:
        _report(False, error=traceback.format_exc())
        return
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        try:
            _report(True, _call(msg["module"], msg["fn"], msg.get("args", [])))
        except BaseException:
            _report(False, error=traceback.format_exc())
    hvd.shutdown()


if __name__ == "__main__":
    main()
