"""What a refused command must leave as it was: everything under a folder."""
import os


def snapshot(top):
    """{path: (kind, contents)} of everything under top: links by their
    target, folders, files by their bytes."""
    out = {}
    for d, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[p] = ("dir", None)
            else:
                with open(p, "rb") as f:
                    out[p] = ("file", f.read())
    return out
