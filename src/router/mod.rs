//! `rbgctl router` (issue 4, in progress): the OpenAI/SGLang-compatible gateway. Built so far:
//! `tree`, the cache-aware policy's approximate radix tree.

pub mod tree;
