"""Templates that ask for a huge value through a width, a count, a repeat, a join or a number
(issue 17).

Output is capped per part, but each of these would build its value before it reached the cap:
``'x'|center(10**9)`` allocated a gigabyte and took seconds before it was refused. Each case
now fails naming its part, and the process's peak RSS stays where it was. Each case renders in
a child interpreter with an address-space limit, so its peak RSS (VmHWM) is its own and a
regression fails the test (MemoryError or the RSS check) without taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The attack, by name. ``x`` is the row's two-character cell.
CASES = {
    "center-filter": "{{ 'x'|center(10**9) }}",
    "center-method": "{{ x.center(10**9) }}",
    "ljust": "{{ x.ljust(10**9) }}",
    "rjust": "{{ x.rjust(10**9) }}",
    "zfill": "{{ x.zfill(10**9) }}",
    "expandtabs": "{{ '\t'.expandtabs(10**9) }}",
    "percent-star-width": "{{ '%*s' % (10**9, 'x') }}",
    "percent-width": "{{ '%1000000000s' % 'x' }}",
    "percent-precision": "{{ '%.1000000000f' % 1.0 }}",
    "format-width": "{{ '{:>1000000000}'.format('x') }}",
    "format-nested-width": "{{ '{0:{1}}'.format('x', 10**9) }}",
    "format-map-width": "{{ '{a:>1000000000}'.format_map({'a': 'x'}) }}",
    "format-many-fields": "{{ ('{0:99999}' * 10000).format(1) }}",
    "format-filter-width": "{{ '%*s'|format(10**9, 'x') }}",
    "indent": "{{ 'a\nb'|indent(10**9) }}",
    "wordwrap-wrapstring": "{{ (x * 25000)|wordwrap(1, wrapstring='y' * 50000) }}",
    "join-range": "{{ range(10000)|join(x * 50000) }}",
    "join-iterator": "{{ range(10000)|map('string')|join(x * 50000) }}",
    "str-join": "{{ (x * 40000).join(x * 40000) }}",
    "str-replace": "{{ (x * 40000).replace('', x * 40000) }}",
    "translate": "{{ (x * 40000).translate({97: x * 40000}) }}",
    "batch-fill": "{{ [1]|batch(10**9, 0)|list|length }}",
    "list-doubling": "{% set l = [x] %}{% for i in range(40) %}{% set _ = l.extend(l) %}"
    "{% endfor %}{{ l|length }}",
    "list-of-copies": "{% set l = [] %}{% for i in range(10000) %}"
    "{% set _ = l.append((x * 40000)|upper) %}{% endfor %}{{ l|length }}",
    "dict-of-copies": "{% set d = {} %}{% for i in range(10000) %}"
    "{% set _ = d.update({i: (x * 40000)[1:]}) %}{% endfor %}{{ d|length }}",
    "macro-buffer": "{% macro m() %}{% for i in range(10000) %}{{ x * 40000 }}{% endfor %}"
    "{% endmacro %}{{ m()|length }}",
    "set-block-buffer": "{% set acc %}{% for i in range(10000) %}"
    + "c" * 60_000
    + "{% endfor %}{% endset %}{{ acc|length }}",
    "tojson-indent": "{{ [[[[1]]]]|tojson(indent=10**8) }}",
    "lipsum": "{{ lipsum(10**6)|length }}",
    # Integer arithmetic (red-team pass 2): each squaring doubles the number; one row took
    # 165 s and 99 MB. A division costs the product of its operands' lengths.
    "int-squaring": "{% set a = 7**100000 %}"
    + "".join(f"{{% set {n} = {p}*{p} %}}" for p, n in zip("abcdefghi", "bcdefghij", strict=True))
    + "{% if j > 1 %}x{% endif %}",
    "int-floordiv": "{% set a = 7**100000 %}{% set b = a*a %}{% set c = b*b %}"
    "{% if (c*c)//(b+1) > 1 %}x{% endif %}",
    "int-to-bytes": "{{ (1).to_bytes(10**9, 'big')|length }}",
    # ~ joined every part before measuring, and lists written in the template were free.
    "concat-chain": "{% set s = x * 50000 %}{% if (" + "~".join(["s"] * 200) + ") %}y{% endif %}",
    "concat-list": "{% set s = x * 49995 %}{% set l = [" + ", ".join(["s ~ 'a'"] * 200) + "] %}"
    "{{ l|length }}",
    # Copies kept in variables: a slice or a text method makes a new text of about the
    # source's size; 1,990 of them held 168-195 MB (300 here: 30 MB).
    "slices-kept": "{% set s = x * 50000 %}"
    + "".join(f"{{% set a{i} = s[{i % 7}:] %}}" for i in range(300))
    + "{{ a1|length }}",
    "methods-kept": "{% set s = x * 50000 %}"
    + "".join(f"{{% set a{i} = s.upper() %}}" for i in range(300))
    + "{{ a1|length }}",
    "split-kept": "{% set s = (x ~ ' ') * 33000 %}"
    + "".join(f"{{% set a{i} = s.split() %}}" for i in range(300))
    + "{{ a1|length }}",
}
PARTS = ("subject", "body", "html")

_CHILD = r"""
import json, resource, sys, time
from sendqueue.domain.errors import InvalidInput
from sendqueue.services.importing.rows import parse_recipient_rows
from sendqueue.services.importing.recipients import Templates

def hwm_mb():
    with open("/proc/self/status") as fh:
        return int(fh.read().split("VmHWM:")[1].split()[0]) / 1024

part, source = sys.argv[1], sys.argv[2]
rows = [{"email": "ada@example.com", "name": "Ada", "x": "ab"}]
templates = Templates(**{"subject": "s", "body": "b", part: source})
parse_recipient_rows(rows, templates=Templates("s", "b"))  # warm up: imports, first compile
with open("/proc/self/status") as fh:
    vm = int(fh.read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 768 * 2**20, resource.RLIM_INFINITY))
before, started = hwm_mb(), time.monotonic()
try:
    parse_recipient_rows(rows, templates=templates)
    out = {"problem": None}
except InvalidInput as exc:
    (p,) = exc.errors
    out = {"problem": [p.field, p.row, p.reason]}
out.update(grown_mb=hwm_mb() - before, seconds=time.monotonic() - started)
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("part", "source"),
    [(PARTS[i % 3], source) for i, source in enumerate(CASES.values())],
    ids=list(CASES),
)
def test_a_huge_value_is_refused_naming_its_part_before_it_is_built(part: str, source: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, part, source],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])

    field, row, reason = result["problem"]
    assert (field, row) == (part, 2)
    assert reason.startswith("template failed: ")
    assert ("characters" in reason or "bits" in reason) and "MemoryError" not in reason, reason
    assert result["grown_mb"] < 8, result
