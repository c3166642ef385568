#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes one gzip -9n man page (cmake/SolarInstall.cmake runs it at build time).

  make_page.py --help2man H --version V --include P.h2m --output P.1.gz PROGRAM
      help2man's page of PROGRAM (its --help and --version) with the text of P.h2m (NAME,
      DESCRIPTION, ENVIRONMENT, FILES, SEE ALSO); for a program with subcommands (solar),
      a COMMANDS section with every subcommand's own --help.
  make_page.py --version V --page P.8 [--options PROGRAM] [--set KEY=VALUE]... --output P.8.gz
      a page written by hand; @VERSION@ becomes V, @KEY@ VALUE, and @OPTIONS@ a paragraph per
      line PROGRAM prints (FLAG, ARG or "", ENV, USAGE, tab-separated: spank/src/man_options.cpp).

Characters outside ASCII become groff's \\[uXXXX] (a `x` sign printed as `??` before), so the
page reads the same in any locale."""
import argparse
import functools
import gzip
import os
import re
import subprocess
import sys
import tempfile


def roff_escape_line(line):
    line = line.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + line if line.startswith((".", "'")) else line


def ascii_roff(text):
    return "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)


def options_roff(program):
    """One .TP paragraph per option line of PROGRAM (FLAG\tARG\tENV\tUSAGE)."""
    out = []
    listing = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        flag, arg, env, usage = line.split("\t")
        # A break point (\:) after each '|': long alternatives may wrap.
        arg = roff_escape_line(arg).removeprefix("\\&").replace("|", "|\\:")
        out += [".TP", f"\\fB{roff_escape_line(flag)}\\fR" + (f"=\\fI{arg}\\fR" if arg else ""),
                f"{roff_escape_line(usage)}.", ".br", f"Environment: \\fB{roff_escape_line(env)}\\fR."]
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def help_of(program, words):
    p = subprocess.run([program, *words, "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "100", "LANG": "C.UTF-8"}, timeout=60)
    if p.returncode != 0:
        sys.exit(f"make_page.py: {program} {' '.join(words)} --help failed: {p.stderr.strip()}")
    return p.stdout


def subcommands(help_text):
    """Names under a CLI11 'Subcommands:' heading."""
    names, inside = [], False
    for line in help_text.splitlines():
        if line.strip() == "Subcommands:":
            inside = True
            continue
        if inside:
            m = re.match(r"^  (\S+)(\s{2,}|$)", line)
            if m:
                names.append(m.group(1))
            elif line and not line.startswith(" "):
                inside = False
    return names


def commands_section(program):
    name = os.path.basename(program)
    out = []

    def walk(words, depth):
        for sub in subcommands(help_of(program, tuple(words))):
            text = help_of(program, (*words, sub))
            out.append(f'.SS "{name} {" ".join([*words, sub])}"')
            out.append(".nf")
            out.extend(roff_escape_line(l) for l in text.rstrip("\n").splitlines())
            out.append(".fi")
            if depth < 1:
                walk([*words, sub], depth + 1)

    walk([], 0)
    return ("[COMMANDS]\nEach subcommand's own --help.\n" + "\n".join(out) + "\n") if out else ""


def write(page_text, output):
    with open(output + ".tmp", "wb") as raw:
        # mtime 0 and no name: the same page gives the same bytes (gzip -9n).
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as z:
            z.write(ascii_roff(page_text).encode("ascii"))
    os.replace(output + ".tmp", output)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--help2man")
    ap.add_argument("--version", required=True)
    ap.add_argument("--include")
    ap.add_argument("--page")
    ap.add_argument("--options", help="program printing the roff of @OPTIONS@")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--output", required=True)
    ap.add_argument("program", nargs="?")
    a = ap.parse_args()
    if a.page:
        text = open(a.page, encoding="utf-8").read().replace("@VERSION@", a.version)
        for kv in a.set:
            key, _, value = kv.partition("=")
            text = text.replace(f"@{key}@", value)
        if "@OPTIONS@" in text:
            if not a.options:
                sys.exit("make_page.py: the page has @OPTIONS@: give --options PROGRAM")
            text = text.replace("@OPTIONS@", options_roff(a.options))
        left = re.findall(r"@[A-Z_]+@", text)
        if left:
            sys.exit(f"make_page.py: {a.page}: no value for {', '.join(sorted(set(left)))}")
        write(text, a.output)
        return
    if not (a.help2man and a.include and a.program):
        ap.error("--help2man, --include and PROGRAM go together")
    with tempfile.TemporaryDirectory() as tmp:
        inc = os.path.join(tmp, "page.h2m")
        with open(inc, "w", encoding="utf-8") as f:
            f.write(open(a.include, encoding="utf-8").read().replace("@VERSION@", a.version))
            f.write("\n" + commands_section(a.program))
        roff = os.path.join(tmp, "page.1")
        subprocess.run([a.help2man, "--no-info", "--no-discard-stderr", "--section=1",
                        f"--version-string={a.version}", f"--include={inc}", f"--output={roff}",
                        a.program], check=True, env={**os.environ, "LANG": "C.UTF-8",
                                                     "COLUMNS": "100"})
        write(open(roff, encoding="utf-8", errors="replace").read(), a.output)


if __name__ == "__main__":
    main()
