//! The adapter coordinator (see [`super`]): the only thing that starts, stops or restarts a
//! channel adapter. Owned by the `telegram` helper.
