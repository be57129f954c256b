"""The shared remote tier on Redis / Valkey (``kvoffload[redis]``: redis-py with hiredis)."""

from kvoffload.tiers.redis.records import RecordCodec, RecordError
from kvoffload.tiers.redis.tier import RedisTier

__all__ = ["RecordCodec", "RecordError", "RedisTier"]
