//! PLACEHOLDER: process running (process groups, timeout kill, bounded capture).
