"""Optional tqdm progress bar (extra ``progress``); a plain iterator without it."""


def progress(iterable, **kw):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, **kw)


if __name__ == "__main__":
    from _cli import not_a_command  # tools/ is the script's directory

    not_a_command(__file__, __doc__)
