"""The train job resumes a run that failed on its checkpoint storage (Ray Train retries worker
errors only): `fit_with_storage_retries` with a fit that fails as Ray Train does on an S3 outage.
The real outage is tests/reliability/test_train_outages.py; this pins which failures are retried."""

from __future__ import annotations

import pytest

from harnessrl.config import TrainConfig
from harnessrl.jobs.train import fit_with_storage_retries


class _Fit:
    def __init__(self, *errors: Exception):
        self.errors, self.calls = list(errors), 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "result"


def test_a_storage_failure_is_resumed_and_others_are_not(caplog):
    cfg = TrainConfig(storage_retries=2, storage_retry_s=0)
    outage = RuntimeError("When uploading checkpoint: AWS Error NETWORK_CONNECTION during PutObject operation")
    fit = _Fit(outage, outage)
    assert fit_with_storage_retries(fit, cfg, "run") == "result" and fit.calls == 3
    assert sum("failed on its checkpoint storage" in r.getMessage() for r in caplog.records) == 2

    with pytest.raises(RuntimeError, match="NETWORK_CONNECTION"):  # more outages than retries
        fit_with_storage_retries(_Fit(outage, outage, outage), cfg, "run")
    bug = _Fit(ValueError("shapes (3,) and (4,) not aligned"))
    with pytest.raises(ValueError):  # not a storage failure: raised at once
        fit_with_storage_retries(bug, cfg, "run")
    assert bug.calls == 1
