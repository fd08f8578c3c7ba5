//! The SeaTalk adapter (see [`super`]): events forwarded by `coffer-callback`, ack-then-final
//! replies. Owned by the `seatalk` helper.
