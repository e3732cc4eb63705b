"""Pass/fail bookkeeping shared by the script tests.

check() counts each check and prints a failure (with its detail, indented)
as it happens; summary() prints "N passed, M failed" and returns the exit
status for sys.exit. (Not a test itself: ctest runs only test_*.py.)
"""
import sys

passed = 0
failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        text = "FAIL: " + what
        if detail:
            text += "\n  " + str(detail).replace("\n", "\n  ")
        print(text, flush=True)
    return bool(cond)


def summary():
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0
