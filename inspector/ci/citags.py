"""Tags for a CI upload read from the usual CI environment variables.

GitHub Actions: GITHUB_SHA, GITHUB_HEAD_REF (a pull request's branch) or GITHUB_REF_NAME,
GITHUB_REF (`refs/pull/N/merge`), GITHUB_RUN_ID. GitLab CI: CI_COMMIT_SHA,
CI_MERGE_REQUEST_SOURCE_BRANCH_NAME or CI_COMMIT_REF_NAME, CI_MERGE_REQUEST_IID, CI_JOB_ID.
Keys: `commit`, `branch`, `pr`, `ci_job` (and `ci`: github or gitlab).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["ci_tags", "TAG_KEYS"]

TAG_KEYS = ("commit", "branch", "pr", "ci_job")
_PULL_REF = re.compile(r"^refs/pull/(\d+)/(?:merge|head)$")


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = (env.get(name) or "").strip()
        if value:
            return value
    return None


def _github(env: Mapping[str, str]) -> dict[str, str | None]:
    pull = _PULL_REF.match(env.get("GITHUB_REF", ""))
    return {
        "ci": "github",
        "commit": _first(env, "GITHUB_SHA"),
        "branch": _first(env, "GITHUB_HEAD_REF", "GITHUB_REF_NAME"),
        "pr": pull.group(1) if pull else None,
        "ci_job": _first(env, "GITHUB_RUN_ID"),
    }


def _gitlab(env: Mapping[str, str]) -> dict[str, str | None]:
    return {
        "ci": "gitlab",
        "commit": _first(env, "CI_COMMIT_SHA"),
        "branch": _first(env, "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME", "CI_COMMIT_REF_NAME"),
        "pr": _first(env, "CI_MERGE_REQUEST_IID"),
        "ci_job": _first(env, "CI_JOB_ID"),
    }


def ci_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The tags this CI run implies; {} outside GitHub Actions and GitLab CI."""
    if env.get("GITHUB_ACTIONS") == "true" or env.get("GITHUB_SHA"):
        found = _github(env)
    elif env.get("GITLAB_CI") == "true" or env.get("CI_COMMIT_SHA"):
        found = _gitlab(env)
    else:
        return {}
    return {k: v[:256] for k, v in found.items() if v}
