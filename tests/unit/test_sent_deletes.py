"""The dispatcher remembers which copies it deleted, so a reconcile that runs before the
watch has delivered a deletion does not send it again."""

from dispatcher.workers.sent_deletes import SentDeletes


def test_sent_deletes_remember_the_latest_uids_only():
    sent = SentDeletes(size=3)
    for uid in ("a", "b", "c", "d"):
        sent.add(uid)
    assert "a" not in sent and all(uid in sent for uid in ("b", "c", "d"))
