"""Where a run's train stream ends, so that neither the workers (which stream on across epochs)
nor a bucket's read-ahead read past the last batch the run takes: on a bucket those reads are
GETs for an epoch that never runs."""

from __future__ import annotations


def stream_end(
    batches_per_epoch: int, stream_batches: tuple[int, int] | None, max_epochs: int | None
) -> tuple[int, int] | None:
    """(epoch, batch) the stream ends before: ``stream_batches`` = (batches from epoch 0, at
    least these whole epochs) where a caller set it (the bench), else the trainer's
    ``max_epochs``; None when unbounded."""
    if stream_batches is not None:
        batches, epochs = stream_batches
        return max(divmod(batches, max(1, batches_per_epoch)), (epochs, 0))
    if max_epochs is not None and max_epochs > 0:
        return int(max_epochs), 0
    return None


def samples_left(
    end: tuple[int, int] | None,
    batches_per_epoch: int,
    limit_train_batches,
    epoch: int,
    start_batch: int,
    batch_size: int,
) -> int | None:
    """Samples the run takes from batch ``start_batch`` of ``epoch`` to ``end``, each epoch cut to
    ``limit_train_batches`` (Lightning's: a count, or a fraction below 1); None when unbounded."""
    if end is None:
        return None
    batches = batches_per_epoch
    if isinstance(limit_train_batches, int) and not isinstance(limit_train_batches, bool):
        batches = min(batches, limit_train_batches)
    elif isinstance(limit_train_batches, float) and limit_train_batches < 1:
        batches = int(batches * limit_train_batches)
    return max(0, (end[0] * batches + end[1] - (epoch * batches + start_batch)) * batch_size)


def trainer_stream_end(
    trainer, stream_batches: tuple[int, int] | None, batches_per_epoch: int
) -> tuple[int, int] | None:
    """:func:`stream_end` for a datamodule, attached to ``trainer`` or not."""
    return stream_end(batches_per_epoch, stream_batches, trainer.max_epochs if trainer is not None else None)


def read_ahead_span(
    trainer, stream_batches, samples_per_epoch: int, batch_size: int, epoch: int, start_batch: int
) -> int | None:
    """Samples a datamodule's train stream takes from where it starts (the read-ahead's end)."""
    batches = -(-samples_per_epoch // batch_size)
    limit = trainer.limit_train_batches if trainer is not None and stream_batches is None else None
    return samples_left(
        trainer_stream_end(trainer, stream_batches, batches), batches, limit, epoch, start_batch, batch_size
    )
