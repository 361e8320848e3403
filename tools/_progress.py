"""Optional tqdm progress bar (extra ``progress``); a plain iterator without it."""


def progress(iterable, **kw):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, **kw)
