"""Runs a test file's test_* functions in order (no pytest needed): prints one line per test and
exits 1 if any failed. Also collects pytest-style files' tests when run under pytest."""
import sys
import time
import traceback


def main(namespace):
    tests = [(name, fn) for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    failed = 0
    for name, fn in tests:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported, then the next test runs
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        else:
            print(f"ok   {name} ({time.perf_counter() - t0:.2f} s)")
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def raises(exception, fn, *args, contains=(), **kwargs):
    """Calls fn and checks it raises `exception` whose message contains every string in `contains`."""
    try:
        fn(*args, **kwargs)
    except exception as e:
        message = str(e)
        for part in contains:
            assert part in message, f"{exception.__name__} message {message!r} does not mention {part!r}"
        return message
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exception.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {exception.__name__}; nothing was raised")
