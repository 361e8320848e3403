"""Speech synthesis with eSpeak NG through the library shipped in the ``espeakng-loader`` wheel.

The wheel ships ``libespeak-ng.so`` and its ``espeak-ng-data`` directory but no Python API, so this module drives
the C API (``speak_lib.h``) with :mod:`ctypes` in synchronous mode and collects the int16 samples from the
synthesis callback.  One process-wide engine is initialised lazily; calls are serialised by the GIL.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

__all__ = ["EspeakSynth", "english_voices", "voice_variants"]

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_espeakCHARS_AUTO = 0
_POS_CHARACTER = 1
# espeak_PARAMETER enum
_espeakRATE, _espeakVOLUME, _espeakPITCH, _espeakRANGE = 1, 2, 3, 4
_espeakWORDGAP = 7

_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def _loader():
    try:
        import espeakng_loader  # type: ignore
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("the 'recipe' extra is needed: pip install espeakng-loader") from exc
    return espeakng_loader


def english_voices() -> list[str]:
    """Names of the English language voices shipped with the wheel (e.g. ``en-us``, ``en-gb-scotland``)."""
    data = _loader().get_data_path()
    root = os.path.join(data, "lang", "gmw")
    names = []
    for f in sorted(os.listdir(root)):
        if f.lower().startswith("en") and f.lower() != "en-shaw":
            names.append(f.lower())
    return names


def voice_variants() -> list[str]:
    """Names of the voice variants (``voices/!v``) shipped with the wheel, sorted."""
    data = _loader().get_data_path()
    root = os.path.join(data, "voices", "!v")
    return sorted(f for f in os.listdir(root) if " " not in f and os.path.isfile(os.path.join(root, f)))


class EspeakSynth:
    """Synthesize text to int16 PCM with libespeak-ng (process singleton).

    ``synth(text, voice, rate, pitch, pitch_range, word_gap) -> np.ndarray int16 [num_samples]`` at
    ``self.sample_rate`` Hz (22050 for eSpeak NG).  ``voice`` is ``"lang"`` or ``"lang+variant"`` (e.g.
    ``"en-us+f3"``); rate in words per minute (80-450), pitch and range 0-100, word_gap in units of 10 ms.
    """

    _instance: EspeakSynth | None = None

    def __new__(cls):
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._init()
            cls._instance = inst
        return cls._instance

    def _init(self):
        loader = _loader()
        lib = ctypes.CDLL(loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CB]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (returned {rate})")
        self.sample_rate = int(rate)
        self._lib = lib
        self._chunks: list[np.ndarray] = []

        def _cb(wav, n, events):
            if n > 0 and wav:
                self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        self._cb = _SYNTH_CB(_cb)  # keep a reference: the library holds the pointer
        lib.espeak_SetSynthCallback(self._cb)

    def synth(self, text: str, voice: str = "en-us", rate: int = 175, pitch: int = 50, pitch_range: int = 50,
              word_gap: int = 0) -> np.ndarray:
        """Return int16 samples ``[num_samples]`` for ``text`` (see the class docstring for the parameters)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text: expected a non-empty string")
        lib = self._lib
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"voice: eSpeak NG does not know voice {voice!r}")
        for par, val in ((_espeakRATE, rate), (_espeakPITCH, pitch), (_espeakRANGE, pitch_range),
                         (_espeakWORDGAP, word_gap)):
            lib.espeak_SetParameter(par, int(val), 0)
        self._chunks = []
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        err = lib.espeak_Synth(buf, len(buf), 0, _POS_CHARACTER, 0, _espeakCHARS_AUTO, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed with code {err}")
        out = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self._chunks = []
        return out.astype(np.int16, copy=False)
