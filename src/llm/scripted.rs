//! PLACEHOLDER: the scripted provider.
