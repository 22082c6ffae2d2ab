"""`KVTransferConfig`: which side of a prefill/decode pair an engine is and where the pair meets."""
from __future__ import annotations

from dataclasses import dataclass

ROLES = ("kv_producer", "kv_consumer")


@dataclass(frozen=True)
class KVTransferConfig:
    """`kv_role`: "kv_producer" (prefills and sends; it listens on `kv_ip`:`kv_port`, 0 picks a free port)
    or "kv_consumer" (receives and decodes; it connects there). Every operation on the link raises
    KVTransferError after `kv_timeout_s`, except a consumer's wait for the next request (it may sit idle;
    the producer's death still ends it at once)."""

    kv_role: str
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.kv_role not in ROLES:
            raise ValueError(f"kv_role must be one of {ROLES}, got {self.kv_role!r}")
        if isinstance(self.kv_port, bool) or not isinstance(self.kv_port, int) or not 0 <= self.kv_port < 65536:
            raise ValueError(f"kv_port must be an int in [0, 65536), got {self.kv_port!r}")
        if self.kv_role == "kv_consumer" and self.kv_port == 0:
            raise ValueError("a kv_consumer needs the producer's kv_port (0 only picks one for a producer)")
        if not self.kv_timeout_s > 0:
            raise ValueError(f"kv_timeout_s must be > 0, got {self.kv_timeout_s!r}")

    @property
    def is_producer(self) -> bool:
        return self.kv_role == "kv_producer"
