"""Writing matplotlib figures, one way for every command that draws (``--png``, reports).

Figures carry no "Software" metadata (it names the matplotlib version), so the same inputs
give byte-identical PNGs; a path that cannot be written is bad input, not a crash.
"""

from __future__ import annotations

from pathlib import Path

from treeattn.errors import InputError
from treeattn.textfile import write_file

__all__ = ["save_figure"]


def save_figure(fig, path: str | Path, *, dpi: int = 100, **savefig_kw) -> Path:  # noqa: ANN001 - a Figure
    """Save ``fig`` as PNG at ``path`` (creating its folder; an existing file is replaced whole or
    not at all) and close it.

    Args:
        fig: a matplotlib Figure.
        path: where to write.
        dpi: resolution.
        savefig_kw: further ``Figure.savefig`` arguments (e.g. ``bbox_inches``).

    Returns:
        The path written.

    Raises:
        InputError: the file cannot be written.
    """
    import io

    import matplotlib.pyplot as plt

    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Drawn in memory, then written whole: a failed write keeps the image there before.
        image = io.BytesIO()
        fig.savefig(image, format=out.suffix[1:].lower() or None, dpi=dpi, metadata={"Software": None},
                    **savefig_kw)
        write_file(out, image.getvalue())
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out
