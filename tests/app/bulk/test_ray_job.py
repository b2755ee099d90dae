"""The Ray Data path on a local Ray: the same ids, vectors and bad rows as the single-machine job, and a
worker killed mid-job is retried by Ray with every id written once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray

from tests.app.bulk.conftest import TEXTS, errors, manifest, run_bulk, shards, vectors, write_jsonl


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Small: two CPUs (an actor and the read and write tasks beside it), no dashboard, a small object
    store; its sessions in a temp dir of this run, not the machine's shared /tmp/ray (`make test` runs two
    test processes, and each may start its own). Now and then (once in some dozens of starts beside the
    other test process) a start fails: the GCS never writes its port (RuntimeError after
    ``RAY_gcs_server_port_wait_time_s``), or the raylet never registers with it (a bare Exception after
    Ray's fixed 30 s). So a start that fails is made again, up to three times, each in a fresh session
    dir, after the processes it left are killed and its logs' tails printed (pytest shows them if the
    last start fails too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_gcs_server_port_wait_time_s", "60")
        for attempt in range(3):
            session = tmp_path_factory.mktemp("ray")
            before = {p.pid for p in psutil.Process().children(recursive=True)}
            try:
                ray.init(
                    num_cpus=2,
                    include_dashboard=False,
                    object_store_memory=150 * 2**20,
                    log_to_driver=False,
                    _temp_dir=str(session),
                )
                break
            except Exception:  # Ray raises both RuntimeError and a bare Exception here
                ray.shutdown()
                left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
                for p in left:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                psutil.wait_procs(left, timeout=10)
                print_log_tails(session, attempt)
                if attempt == 2:
                    raise
        yield
        ray.shutdown()


def print_log_tails(session: Path, attempt: int) -> None:
    """The last lines of the GCS's and raylet's logs of a failed start."""
    for log in sorted(session.glob("session_*/logs/*")):
        if log.name.startswith(("gcs_server", "raylet")) and log.is_file():
            lines = log.read_text(errors="replace").splitlines()
            tail = [line for line in lines if not line.startswith("[state-dump]")][-15:]
            print(f"--- Ray start {attempt + 1} failed; {log.name}:", *tail, sep="\n")


def sorted_errors(out: Path) -> list[dict[str, str]]:
    return sorted(errors(out), key=lambda e: e["id"])


def test_the_ray_path_writes_what_the_single_machine_job_writes(
    local_ray: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # More rows than one engine call takes, bad ones among them.
    rows: list[dict[str, object]] = [{"text": t} for t in TEXTS * 2]
    rows[40:40] = [{"text": ""}, {"text": 5}, {"other": 1}, {"text": "\u200b"}, {"text": "长" * 300}]
    rows += [{"text": f"{n} 号"} for n in range(50)]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "local", "--layers", "-1", "-2") == 3
    assert (
        run_bulk(tiny_model_dir, corpus, tmp_path / "ray", "--layers", "-1", "-2", "--ray", "--window", "16")
        == 3
    )
    local, on_ray = vectors(tmp_path / "local"), vectors(tmp_path / "ray")
    assert sorted(local) == sorted(on_ray)
    assert max(float(np.abs(local[k] - on_ray[k]).max()) for k in local) <= 1e-5
    assert shards(tmp_path / "ray").schema == shards(tmp_path / "local").schema
    assert sorted_errors(tmp_path / "ray") == sorted_errors(tmp_path / "local")
    assert manifest(tmp_path / "ray")["counts"] | {"shards": 0} == manifest(tmp_path / "local")["counts"] | {
        "shards": 0
    }
    assert not list((tmp_path / "ray").glob("_ray-*"))  # staging is gone once committed


def test_an_unfinished_single_machine_run_is_not_continued_on_ray(
    local_ray: None, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS])
    out = tmp_path / "out"
    assert run_bulk(tiny_model_dir, corpus, out) == 0
    (out / "_manifest.json").write_bytes(
        (out / "_manifest.json").read_bytes().replace(b'"done"', b'"running"')
    )
    assert run_bulk(tiny_model_dir, corpus, out, "--ray") == 2
    assert "which the Ray path cannot continue" in capsys.readouterr().err.strip().splitlines()[-1]


def actor_processes() -> list[psutil.Process]:
    """This test's Ray actors that embed (Ray names their processes after the class)."""
    found = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "EmbedBatch" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_a_worker_killed_mid_job_is_retried_and_every_id_is_written_once(
    local_ray: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = [{"text": f"{n} 号：今天天气很好，我们去公园散步吧。" * (1 + n % 3)} for n in range(4000)]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "ray"
    flags = ("--ray", "--window", "128", "--shard-rows", "128")
    status: list[int] = []
    job = threading.Thread(target=lambda: status.append(run_bulk(tiny_model_dir, corpus, out, *flags)))
    job.start()
    deadline = time.monotonic() + 180
    while len(list(out.glob("_ray-*/parts/*.parquet"))) < 2:  # some batches written: mid-job
        assert job.is_alive() and time.monotonic() < deadline, "the job ended before a worker could be killed"
        time.sleep(0.01)
    (victim,) = actor_processes()
    os.kill(victim.pid, signal.SIGKILL)
    written_then = len(list(out.glob("_ray-*/parts/*.parquet")))
    job.join(timeout=300)
    assert status == [0] and not victim.is_running()
    # Files were still to come when the one actor died: another one made them (Ray restarted it).
    assert written_then < manifest(out)["counts"]["shards"]
    got = shards(out).column("id").to_pylist()
    assert sorted(got) == sorted(f"c.jsonl:{n}" for n in range(1, 4001))  # none missing, none twice
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "local") == 0
    local, on_ray = vectors(tmp_path / "local"), vectors(out)
    assert max(float(np.abs(local[k] - on_ray[k]).max()) for k in local) <= 1e-5
