"""Transformers named by a Hugging Face Hub id (``meta-llama/Meta-Llama-3-8B``).

    pip install 'perfmodel[hf]'
    m = pm.from_hf_hub("meta-llama/Meta-Llama-3-8B")        # config.json from the local cache, else the Hub

Only ``config.json`` is read (no weights). The local Hugging Face cache is
tried first, so a config downloaded once (or copied in) works offline;
``HF_HUB_OFFLINE=1`` forbids the network altogether. Gated repositories need
``huggingface-cli login`` (or ``HF_TOKEN``) for the first download.
"""

from __future__ import annotations

import re

from perfmodel.core.errors import InvalidInputError, UnknownNameError
from perfmodel.core.extras import optional_import
from perfmodel.workload.hf import from_hf_config

# owner/name as the Hub spells repository ids (huggingface_hub.utils.validate_repo_id)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hub repository id rather than a file or a preset name."""
    return bool(HUB_ID.match(str(text))) and not str(text).endswith((".json", ".toml"))


def hub_config_path(repo_id: str, *, revision: str | None = None) -> str:
    """Local path of the repository's ``config.json``: from the cache, downloaded when missing and allowed."""
    if not is_hub_id(repo_id):
        raise InvalidInputError(f"'model' {repo_id!r} is neither a file nor a Hub id of the form owner/name "
                                "(e.g. meta-llama/Meta-Llama-3-8B)")
    hub = optional_import("huggingface_hub", extra="hf", feature="Hugging Face Hub ids")
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return hub.hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=True)
    except LocalEntryNotFoundError:
        pass  # not cached yet: ask the Hub (refused there too when HF_HUB_OFFLINE is set)
    try:
        return hub.hf_hub_download(repo_id, "config.json", revision=revision)
    except LocalEntryNotFoundError as exc:  # offline, or the Hub unreachable (a subclass of the next)
        raise InvalidInputError(f"Hugging Face Hub model {repo_id!r}: config.json is not in the local cache and "
                                f"could not be downloaded ({type(exc).__name__}); download it once while online, "
                                "or give the path of a config.json") from None
    except (RepositoryNotFoundError, EntryNotFoundError) as exc:
        raise UnknownNameError(f"Hugging Face Hub model {repo_id!r} has no config.json there ({type(exc).__name__}; "
                               "a gated repository needs `huggingface-cli login`)") from None
    except OSError as exc:  # a network error other than the ones above
        raise InvalidInputError(f"Hugging Face Hub model {repo_id!r}: could not download config.json "
                                f"({type(exc).__name__}: {exc})") from None


def from_hf_hub(repo_id: str, *, revision: str | None = None, seq: int | None = None):
    """The transformer of a Hub repository's ``config.json``, named after the repository id."""
    return from_hf_config(hub_config_path(repo_id, revision=revision), seq=seq, name=repo_id)
