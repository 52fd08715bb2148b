"""The files strata-report writes, checked before it writes any: none may be
a file it reads (the report or index, compared by identity, so that a hard
or symbolic link to it or another spelling of its path counts), nor a file
another of its outputs writes, nor a directory, a device or a FIFO, nor a
run's claim or a report being written (*.lock, *.partial). A refusal is a
ReportError: one line naming the option, the path and what it collides
with; the command exits 2 having written nothing.

`check` is the one place this is decided: the command calls it for all its
outputs before reading anything, and each writer (plots.write_all,
sweep.plot, trace.write, trace.write_per_rank) for its own before it
writes, so that the API cannot overwrite its report either."""
import os

from .read import ReportError

# The names `strata run` gives its claim on a report path and the report
# while it is written: a tool writing there would corrupt a run.
RESERVED_SUFFIXES = (".lock", ".partial")


def same_file(a, b):
    """Whether paths a and b name one file: by identity (device and inode)
    where both exist, so that a hard or symbolic link counts; else by their
    real paths (links resolved, ./ and .. removed)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _writable_dir(path, what):
    """Raises ReportError unless `path` is a writable directory or can be made."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ReportError(f"{what} {path}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ReportError(f"{what} {path}: the directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ReportError(f"{what} {path}: cannot be made: {parent} is not a writable directory")


def _regular(target, what, path):
    """Raises ReportError when `target`, a file `what path` writes, is a
    directory or exists as anything but a regular file (a device, FIFO or
    socket, which a write would block on or fail at)."""
    said = f"{what} {path}: " + ("" if target == path else f"would write {target}, which ")
    if os.path.isdir(target):
        raise ReportError(said + ("is a directory; give a file's name" if target == path else "is a directory"))
    if os.path.exists(target) and not os.path.isfile(target):
        raise ReportError(said + "exists and is not a regular file (a device, FIFO or socket)")


def check(inputs, files=(), dirs=()):
    """Raises ReportError unless every output can be written without harm.

    inputs: [(label, path)], the files read ("the input").
    files:  [(option, path)], outputs that are one file.
    dirs:   [(option, directory, names)], outputs that are files of those
            names in a directory (made if need be); a name may be a
            compiled pattern (re.Pattern), standing for every name of that
            form: the entries of the directory that match it, and any other
            output's file there that does.
    """
    given = [(opt, path) for opt, path in files] + [(opt, d) for opt, d, _ in dirs]
    for opt, path in given:
        for p in (path, os.path.realpath(path)):
            if p.endswith(RESERVED_SUFFIXES):
                raise ReportError(f"{opt} {path}: ends in .lock or .partial, the names of a run's claim and of a "
                                  f"report being written; give another name")
    # Every path written, as (option, its path, the path written, a directory?).
    targets = [(opt, path, path, False) for opt, path in files]
    for opt, d, names in dirs:
        targets.append((opt, d, d, True))
        for name in names:
            if isinstance(name, str):
                targets.append((opt, d, os.path.join(d, name), False))
                continue
            try:
                entries = sorted(os.listdir(d)) if os.path.isdir(d) else []
            except OSError:
                entries = []
            targets += [(opt, d, os.path.join(d, e), False) for e in entries if name.fullmatch(e)]
    def said(opt, path, target):
        return f"{opt} {path}: " + ("is" if target == path else f"would write {target}, which is")

    for opt, path, target, _ in targets:
        for label, inp in inputs:
            if same_file(target, inp):
                raise ReportError(f"{said(opt, path, target)} {label} {inp} (the same file): writing it would "
                                  f"destroy what is read; give another path")
    for i, (opt, path, target, is_dir) in enumerate(targets):
        # Two options on one file (a directory two options write into is fine:
        # their files have names of their own).
        for opt2, path2, target2, is_dir2 in targets[:i]:
            if opt2 == opt and path2 == path or (is_dir and is_dir2) or not same_file(target, target2):
                continue
            where = "" if target2 == path2 else f" ({target2})"
            raise ReportError(f"{said(opt, path, target)} also written by {opt2} {path2}{where}; give each output "
                              f"a path of its own")
        if is_dir:
            continue
        # A file in a directory another option writes files of a pattern into.
        real = os.path.realpath(target)
        for opt2, d, names in dirs:
            if (opt2 != opt or d != path) and same_file(os.path.dirname(real), d) and any(
                    not isinstance(n, str) and n.fullmatch(os.path.basename(real)) for n in names):
                raise ReportError(f"{said(opt, path, target)} also written by {opt2} {d} (a name of its files); "
                                  f"give each output a path of its own")
    for opt, path, target, is_dir in targets:
        if is_dir:
            _writable_dir(target, opt)
        else:
            _regular(target, opt, path)
    for opt, path in files:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ReportError(f"{opt} {path}: the directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ReportError(f"{opt} {path}: the directory {parent} is not writable")
