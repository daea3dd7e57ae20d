"""Per-key write quotas: charges add up per key, a charge beyond the quota is refused whole and counts
nothing, and the counts survive a reopen (a server restart)."""

from __future__ import annotations

import pytest

from turborag.store.write_quota import QuotaExceeded, WriteQuota


def test_charges_add_up_per_key_and_a_refusal_counts_nothing(tmp_path):
    quota = WriteQuota(tmp_path, 1000)
    quota.charge("a", 600)
    quota.charge("b", 900)  # another key's own quota
    with pytest.raises(QuotaExceeded, match=r"key 'a' may add 0\.0 MB .*has added 0\.0 MB"):
        quota.charge("a", 401)
    assert (quota.used("a"), quota.used("b"), quota.used("c")) == (600, 900, 0)
    quota.budget("a").charge(400)  # exactly the quota is allowed
    assert quota.used("a") == 1000


def test_counts_survive_a_reopen_with_another_limit(tmp_path):
    WriteQuota(tmp_path, 1000).charge("a", 700)
    again = WriteQuota(tmp_path, 800)
    assert again.used("a") == 700
    with pytest.raises(QuotaExceeded, match="--max-cache-bytes-per-key"):
        again.charge("a", 101)


def test_a_quota_below_one_byte_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 1 byte"):
        WriteQuota(tmp_path, 0)
