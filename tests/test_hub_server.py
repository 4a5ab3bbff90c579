"""The local Hub server against the real huggingface_hub client (no mocks).

These tests pin down the contract our push/pull code relies on: if a huggingface_hub
upgrade starts using an endpoint the server lacks, they fail with the route named.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import (
    CommitOperationAdd,
    HfApi,
    ModelCard,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

BIG = os.urandom(1_100_000)  # > 1 MB => "lfs" upload mode
README = """---
license: apache-2.0
tags:
- continual-learning
library_name: hf_clroute
---
# A card
"""


@pytest.fixture
def api(hub_server) -> HfApi:
    return HfApi(endpoint=hub_server.url)


@pytest.fixture
def repo(api: HfApi, hub_repo_id: str) -> str:
    api.create_repo(hub_repo_id)
    return hub_repo_id


def _n_commits(hub_server, repo_id: str, repo_type: str = "model") -> int:
    return len(hub_server.store.load(repo_type, repo_id)["commits"])


def test_environment_points_at_local_hub(hub_server) -> None:
    from huggingface_hub import constants

    assert constants.ENDPOINT == hub_server.url == os.environ["HF_ENDPOINT"]
    assert constants.HF_HUB_DISABLE_XET and not constants.HF_HUB_OFFLINE
    assert HfApi().whoami()["name"] == "tester"


def test_create_repo_exist_ok_and_namespace(api: HfApi, hub_repo_id: str) -> None:
    url = api.create_repo(hub_repo_id)
    assert url.repo_id == hub_repo_id and url.endpoint == api.endpoint
    assert api.create_repo(hub_repo_id, exist_ok=True).repo_id == hub_repo_id
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(hub_repo_id)
    assert err.value.response.status_code == 409
    bare = hub_repo_id.split("/")[1] + "-bare"  # no namespace => the user's, as on the Hub
    assert api.create_repo(bare).repo_id == f"tester/{bare}"
    assert api.repo_exists(f"tester/{bare}")


def test_upload_regular_and_lfs_then_download(api: HfApi, repo: str, hub_server, tmp_path: Path) -> None:
    api.upload_file(path_or_fileobj=b"hello hub\n", path_in_repo="notes/hello.txt", repo_id=repo)
    info = api.upload_file(path_or_fileobj=BIG, path_in_repo="weights.bin", repo_id=repo)
    assert len(info.oid) == 40

    siblings = {s.rfilename: s for s in api.model_info(repo, files_metadata=True).siblings}
    assert siblings["notes/hello.txt"].lfs is None  # went inline (regular)
    assert siblings["weights.bin"].lfs is not None and siblings["weights.bin"].lfs.size == len(BIG)
    assert api.model_info(repo).sha == info.oid

    path = hf_hub_download(repo, "weights.bin", cache_dir=tmp_path)
    assert Path(path).read_bytes() == BIG
    assert Path(hf_hub_download(repo, "notes/hello.txt", cache_dir=tmp_path)).read_bytes() == b"hello hub\n"
    meta = get_hf_file_metadata(hf_hub_url(repo, "weights.bin"))
    assert meta.commit_hash == info.oid and len(meta.etag) == 64 and meta.size == len(BIG)

    # Unchanged content: the client skips the upload (preupload reports the same oid) => no new commit.
    before = _n_commits(hub_server, repo)
    api.upload_file(path_or_fileobj=b"hello hub\n", path_in_repo="notes/hello.txt", repo_id=repo)
    assert _n_commits(hub_server, repo) == before


def test_upload_folder_one_commit_list_and_snapshot(api: HfApi, repo: str, hub_server, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "sub" / "model.safetensors").write_bytes(b"\0" * 100)  # small but binary => lfs
    (src / "router.safetensors").write_bytes(b"\1" * 100)  # a second LFS file: concurrent PUTs
    (src / "sub" / "notes.md").write_text("notes")
    before = _n_commits(hub_server, repo)
    info = api.upload_folder(folder_path=src, repo_id=repo)
    assert _n_commits(hub_server, repo) == before + 1

    expected = {".gitattributes", "config.json", "router.safetensors", "sub/model.safetensors", "sub/notes.md"}
    assert set(api.list_repo_files(repo)) == expected
    top = {f.path: type(f).__name__ for f in api.list_repo_tree(repo)}
    assert top == {p: "RepoFile" for p in expected if "/" not in p} | {"sub": "RepoFolder"}
    assert {f.path for f in api.list_repo_tree(repo, path_in_repo="sub")} == {"sub/model.safetensors", "sub/notes.md"}
    assert api.model_info(repo).sha == info.oid

    snap = Path(snapshot_download(repo, cache_dir=tmp_path / "cache"))
    for rel in expected - {".gitattributes"}:
        assert (snap / rel).read_bytes() == (src / rel).read_bytes()


def test_second_commit_and_old_revision(api: HfApi, repo: str, tmp_path: Path) -> None:
    old = api.upload_file(path_or_fileobj=b"v1", path_in_repo="f.txt", repo_id=repo).oid
    new = api.upload_file(path_or_fileobj=b"v2", path_in_repo="f.txt", repo_id=repo).oid
    assert old != new and api.model_info(repo).sha == new
    assert Path(hf_hub_download(repo, "f.txt", cache_dir=tmp_path)).read_bytes() == b"v2"
    assert Path(hf_hub_download(repo, "f.txt", revision=old, cache_dir=tmp_path)).read_bytes() == b"v1"
    assert api.model_info(repo, revision=old).sha == old


def test_missing_file_repo_and_revision(api: HfApi, repo: str, tmp_path: Path) -> None:
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "nope.txt", cache_dir=tmp_path)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("tester/does-not-exist", "x.txt", cache_dir=tmp_path)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("tester/does-not-exist")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(repo, revision="0" * 40)


def test_readme_metadata_model_card_and_delete(api: HfApi, repo: str, tmp_path: Path) -> None:
    api.upload_file(path_or_fileobj=README.encode(), path_in_repo="README.md", repo_id=repo)
    card = ModelCard.load(repo)
    assert card.data.license == "apache-2.0" and "continual-learning" in card.data.tags
    assert api.model_info(repo).card_data.library_name == "hf_clroute"
    with pytest.raises(ValueError, match="Invalid metadata"):  # validate-yaml answers 400
        api.upload_file(path_or_fileobj=b"---\na: [unclosed\n---\n", path_in_repo="README.md", repo_id=repo)

    api.delete_file("README.md", repo_id=repo)
    assert "README.md" not in api.list_repo_files(repo)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "README.md", cache_dir=tmp_path)


def test_dataset_repo_round_trip(api: HfApi, hub_repo_id: str, tmp_path: Path) -> None:
    api.create_repo(hub_repo_id, repo_type="dataset")
    api.create_commit(
        hub_repo_id,
        [CommitOperationAdd("data/train.parquet", b"PAR1" + BIG[:1000])],
        commit_message="data",
        repo_type="dataset",
    )
    assert [s.rfilename for s in api.dataset_info(hub_repo_id).siblings] == [".gitattributes", "data/train.parquet"]
    path = hf_hub_download(hub_repo_id, "data/train.parquet", repo_type="dataset", cache_dir=tmp_path)
    assert Path(path).read_bytes() == b"PAR1" + BIG[:1000]
    with pytest.raises(RepositoryNotFoundError):  # a dataset is not a model
        api.model_info(hub_repo_id)


def test_range_request(repo: str, api: HfApi, hub_server) -> None:
    api.upload_file(path_or_fileobj=b"0123456789", path_in_repo="digits.txt", repo_id=repo)
    r = httpx2.get(f"{hub_server.url}/{repo}/resolve/main/digits.txt", headers={"Range": "bytes=3-5"})
    assert r.status_code == 206 and r.content == b"345" and r.headers["Content-Range"] == "bytes 3-5/10"


def test_unknown_route_fails_loudly(api: HfApi, repo: str, hub_server, capfd) -> None:
    with pytest.raises(HfHubHTTPError) as err:
        api.list_repo_refs(repo)  # /api/models/{repo}/refs is not implemented
    assert err.value.response.status_code == 501
    assert f"GET /api/models/{repo}/refs" in str(err.value)
    assert f"GET /api/models/{repo}/refs" in capfd.readouterr().err
    assert hub_server.unrouted.pop() == f"GET /api/models/{repo}/refs"


def test_writes_need_a_token(hub_server, hub_repo_id: str, repo: str) -> None:
    anon = HfApi(endpoint=hub_server.url, token=False)
    with pytest.raises(HfHubHTTPError) as err:
        anon.create_repo(hub_repo_id + "-anon")
    assert err.value.response.status_code == 401
    commit = httpx2.post(f"{hub_server.url}/api/models/{repo}/commit/main", content=b"")
    assert commit.status_code == 401 and "Authorization" in commit.json()["error"]
    assert anon.model_info(repo).id == repo  # reads of public repos stay anonymous


def test_server_down_raises_connection_error(api: HfApi, repo: str, hub_down_endpoint: str, tmp_path: Path) -> None:
    assert hub_down_endpoint == api.endpoint
    with pytest.raises(httpx2.ConnectError):
        api.model_info(repo)
    with pytest.raises(httpx2.ConnectError):  # "push while the Hub is down" (retries shrunk by the fixture)
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo)
    with pytest.raises(LocalEntryNotFoundError):  # download: nothing cached => the client's offline error
        hf_hub_download(repo, ".gitattributes", cache_dir=tmp_path)


def test_restart_keeps_port_and_data(api: HfApi, repo: str, hub_server) -> None:
    url = hub_server.url
    hub_server.stop()
    hub_server.start()
    assert hub_server.url == url and ".gitattributes" in api.list_repo_files(repo)
