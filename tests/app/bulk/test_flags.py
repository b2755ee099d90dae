"""The job's flags come from the declarations they stand for: every EmbedOptions field, the service's
settings; the help lists them all."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.bulk import flags
from app.bulk.cli import parser
from app.settings import Settings
from app.tasks.options import EmbedOptions

REQUIRED = ["--input", "x.jsonl", "--output", "out"]


def test_every_embed_option_is_a_flag_and_the_help_lists_every_flag() -> None:
    text = parser().format_help()
    for f in dataclasses.fields(EmbedOptions):
        assert f"--{f.name.replace('_', '-')}" in text, f.name
    for name in flags.SETTING_FLAGS:
        assert f"--{name.replace('_', '-')}" in text, name
        # Its help is the setting's own description (its first words, before argparse wraps them).
        description = Settings.model_fields[name].description or ""
        assert " ".join(description.split()[:3]) in " ".join(text.split()), name
    for flag in (
        "--model",
        "--text-field",
        "--id-field",
        "--encoding",
        "--shard-rows",
        "--overwrite",
        "--ray",
        "--ray-actors",
        "--ray-cpus",
        "--ray-gpus",
        "--window",
        "--progress",
        "--format",
        "--no-normalize",
    ):
        assert flag in text, flag


def test_options_left_out_are_not_given_and_given_ones_keep_their_types() -> None:
    assert flags.given_options(parser().parse_args(REQUIRED)) == {}
    args = parser().parse_args(
        [
            *REQUIRED,
            "--pooling",
            "cls",
            "--layers",
            "-1",
            "-2",
            "--layer-combine",
            "weighted",
            "--layer-weights",
            "1",
            "2.5",
            "--no-normalize",
            "--long-text",
            "chunk",
            "--truncation-direction",
            "left",
            "--prompt-name",
            "q",
        ]
    )
    given = flags.given_options(args)
    assert dataclasses.replace(EmbedOptions(), **given) == EmbedOptions(
        pooling="cls",
        layers=(-1, -2),
        layer_combine="weighted",
        layer_weights=(1.0, 2.5),
        normalize=False,
        long_text="chunk",
        truncation_direction="left",
        prompt_name="q",
    )


def test_choices_are_the_option_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parser().parse_args([*REQUIRED, "--pooling", "median"])
    assert caught.value.code == 2
    assert "invalid choice: 'median'" in capsys.readouterr().err


def test_settings_come_from_the_flags_given_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZHEMBED_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("ZHEMBED_MODEL", "from-env")
    settings = flags.settings_of(parser().parse_args([*REQUIRED, "--variant", "fp32"]), None)
    assert (settings.model, settings.variant, settings.max_batch_size) == ("from-env", "fp32", 16)
    settings = flags.settings_of(parser().parse_args([*REQUIRED, "--max-batch-size", "4"]), "m")
    assert (settings.model, settings.max_batch_size, settings.cache_dir) == ("m", 4, Path("~/.cache/zhembed"))


def test_a_setting_the_service_refuses_is_one_line_naming_its_flag() -> None:
    with pytest.raises(
        flags.UsageError, match=r"^--max-batch-size: Input should be greater than or equal to 1$"
    ):
        flags.settings_of(parser().parse_args([*REQUIRED, "--max-batch-size", "0"]), None)


def test_a_job_plans_for_throughput_unless_told_a_queue_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZHEMBED_MAX_QUEUE_DELAY_MS", raising=False)
    assert (
        flags.settings_of(parser().parse_args(REQUIRED), None).max_queue_delay_ms == flags.BULK_QUEUE_DELAY_MS
    )
    given = parser().parse_args([*REQUIRED, "--max-queue-delay-ms", "50"])
    assert flags.settings_of(given, None).max_queue_delay_ms == 50
    monkeypatch.setenv("ZHEMBED_MAX_QUEUE_DELAY_MS", "75")
    assert flags.settings_of(parser().parse_args(REQUIRED), None).max_queue_delay_ms == 75


def test_the_queue_delay_variable_reaches_the_job_as_settings_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Settings reads ZHEMBED_* variables in any case; the job asks Settings what was set, not the
    # environment, so a variable Settings takes is never overridden by the job's own default.
    monkeypatch.delenv("ZHEMBED_MAX_QUEUE_DELAY_MS", raising=False)
    monkeypatch.setenv("zhembed_max_queue_delay_ms", "75")
    assert flags.settings_of(parser().parse_args(REQUIRED), None).max_queue_delay_ms == 75
