//! The Telegram adapter (see [`super`]): Bot API long polling. Owned by the `telegram` helper.
