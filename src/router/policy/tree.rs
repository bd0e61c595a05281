//! The cache-aware policy's approximate radix tree: one character-level tree of request texts
//! shared by all workers ("tenants"). Every node remembers which workers were sent text through
//! it and when, so the tree answers "which worker has most likely cached the longest prefix of
//! this text" without asking the workers. Size is bounded per worker: the least recently used
//! leaves of a worker over its character budget are dropped (sglang-router's `tree.rs` semantics,
//! `../shared/reference/router_bench_hicache.md` §2).
//!
//! Nodes live in an arena (`Vec<Node>`) with a free list, so splits and prunes never move other
//! nodes and no reference counting is needed.

use std::collections::BinaryHeap;
use std::sync::Arc;

/// The tree's maps, hashed with foldhash: a request walks several of them, and the keys (a
/// character, a worker's URL) come from the router's own state, not from a client directly
/// (a client's text picks which child, not how the map is hashed).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A worker, as the tree names it (its URL).
pub type Tenant = Arc<str>;

const ROOT: usize = 0;

#[derive(Debug, Default)]
struct Node {
    text: String,
    /// Characters in `text`.
    chars: usize,
    children: HashMap<char, usize>,
    parent: usize,
    /// Worker → logical time of its last use of this node.
    tenants: HashMap<Tenant, u64>,
}

/// The result of a prefix match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The most recent worker at the deepest node reached, if any.
    pub tenant: Option<Tenant>,
    pub matched_chars: usize,
    pub input_chars: usize,
}

impl Match {
    /// Matched over input characters; 0 for empty input.
    pub fn rate(&self) -> f64 {
        if self.input_chars == 0 {
            0.0
        } else {
            self.matched_chars as f64 / self.input_chars as f64
        }
    }
}

/// The cache-aware policy's approximate radix tree of request texts.
#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    free: Vec<usize>,
    tenant_chars: HashMap<Tenant, usize>,
    clock: u64,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            nodes: vec![Node::default()],
            free: Vec::new(),
            tenant_chars: HashMap::default(),
            clock: 0,
        }
    }
}

/// Characters shared at the start of `a` and `b`, and the byte length of that prefix in each.
/// Characters and bytes `node`'s text shares with the start of `rest`: the node's own count
/// when all of it matches (the common case on a warm tree), else counted.
fn shared_with(node: &Node, rest: &str) -> (usize, usize) {
    let bytes = common_prefix_bytes(&node.text, rest);
    if bytes == node.text.len() {
        (node.chars, bytes)
    } else {
        (node.text[..bytes].chars().count(), bytes)
    }
}

#[cfg(test)]
fn common_prefix(a: &str, b: &str) -> (usize, usize) {
    let bytes = common_prefix_bytes(a, b);
    (a[..bytes].chars().count(), bytes)
}

/// The bytes `a` and `b` share at their start, ending on a character boundary.
fn common_prefix_bytes(a: &str, b: &str) -> usize {
    // Bytes first, then back to the last whole character both share: UTF-8 is prefix-free,
    // so equal bytes up to a boundary are equal characters. A whole match (the common case on
    // a warm tree) is one `memcmp`; otherwise blocks of 32 bytes (compared as vectors), then
    // bytes.
    const BLOCK: usize = 32;
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let n = x.len().min(y.len());
    let mut bytes = 0;
    if x[..n] == y[..n] {
        bytes = n;
    } else {
        while bytes + BLOCK <= n {
            let (p, q): (&[u8; BLOCK], &[u8; BLOCK]) = (
                x[bytes..bytes + BLOCK].try_into().expect("a block"),
                y[bytes..bytes + BLOCK].try_into().expect("a block"),
            );
            if p != q {
                break;
            }
            bytes += BLOCK;
        }
        while bytes < n && x[bytes] == y[bytes] {
            bytes += 1;
        }
    }
    while !a.is_char_boundary(bytes) {
        bytes -= 1;
    }
    bytes
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Characters of text held for `tenant`.
    pub fn tenant_chars(&self, tenant: &str) -> usize {
        self.tenant_chars.get(tenant).copied().unwrap_or(0)
    }

    /// Each worker in the tree, with the characters it holds.
    pub fn tenants(&self) -> impl Iterator<Item = (&Tenant, &usize)> {
        self.tenant_chars.iter()
    }

    /// Nodes in use (without the root).
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn new_node(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn add_tenant(&mut self, node: usize, tenant: &Tenant, now: u64) {
        let n = &mut self.nodes[node];
        if n.tenants.insert(tenant.clone(), now).is_none() {
            *self.tenant_chars.entry(tenant.clone()).or_default() += n.chars;
        }
    }

    /// Records that `text` was sent to `tenant`.
    pub fn insert(&mut self, text: &str, tenant: &Tenant) {
        let now = self.tick();
        let mut cur = ROOT;
        let mut rest = text;
        while let Some(first) = rest.chars().next() {
            let Some(&child) = self.nodes[cur].children.get(&first) else {
                let leaf = self.new_node(Node {
                    text: rest.to_string(),
                    chars: rest.chars().count(),
                    parent: cur,
                    ..Node::default()
                });
                self.nodes[cur].children.insert(first, leaf);
                self.add_tenant(leaf, tenant, now);
                return;
            };
            let (chars, bytes) = shared_with(&self.nodes[child], rest);
            let node = if chars < self.nodes[child].chars {
                self.split(child, chars, bytes)
            } else {
                child
            };
            self.add_tenant(node, tenant, now);
            rest = &rest[bytes..];
            cur = node;
        }
    }

    /// Splits `child` after `chars` characters (`bytes` bytes); returns the new upper node,
    /// which carries the same tenants (so per-tenant counts do not change).
    fn split(&mut self, child: usize, chars: usize, bytes: usize) -> usize {
        let parent = self.nodes[child].parent;
        let upper_text = self.nodes[child].text[..bytes].to_string();
        let lower_text = self.nodes[child].text[bytes..].to_string();
        let first_lower = lower_text.chars().next().expect("split inside the text");
        let first_upper = upper_text
            .chars()
            .next()
            .expect("split after one char at least");
        let upper = self.new_node(Node {
            text: upper_text,
            chars,
            children: HashMap::from_iter([(first_lower, child)]),
            parent,
            tenants: self.nodes[child].tenants.clone(),
        });
        let c = &mut self.nodes[child];
        c.chars -= chars;
        c.text = lower_text;
        c.parent = upper;
        self.nodes[parent].children.insert(first_upper, upper);
        upper
    }

    /// Walks `text`'s path down the tree: `visit` sees each node reached and the characters
    /// matched down to it (the last node may match in part), and stops the walk by answering
    /// false. Returns the characters of `text`.
    fn walk(&self, text: &str, mut visit: impl FnMut(usize, usize) -> bool) -> usize {
        let mut cur = ROOT;
        let mut rest = text;
        let mut matched = 0;
        while let Some(first) = rest.chars().next() {
            let Some(&child) = self.nodes[cur].children.get(&first) else {
                break;
            };
            let (chars, bytes) = shared_with(&self.nodes[child], rest);
            matched += chars;
            rest = &rest[bytes..];
            if !visit(child, matched) || chars < self.nodes[child].chars {
                break;
            }
            cur = child;
        }
        // What matched is counted already: only the rest of the text is.
        matched + rest.chars().count()
    }

    /// The longest prefix of `text` in the tree and a worker that holds it.
    pub fn prefix_match(&self, text: &str) -> Match {
        let (mut deepest, mut matched) = (None, 0);
        let input_chars = self.walk(text, |node, m| {
            (deepest, matched) = (Some(node), m);
            true
        });
        let tenant = deepest.and_then(|n| {
            self.nodes[n]
                .tenants
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(t, _)| t.clone())
        });
        Match {
            tenant,
            matched_chars: matched,
            input_chars,
        }
    }

    /// For each of `tenants`, the characters of the longest prefix of `text` it was sent, and
    /// the characters of `text`: every node on a text's path carries the tenants sent through
    /// it, so a tenant holds the path down to the deepest node that carries it (and the walk
    /// ends where none of them is left).
    pub fn held_by(&self, text: &str, tenants: &[Tenant]) -> (Vec<usize>, usize) {
        let mut held = vec![0; tenants.len()];
        let chars = self.walk(text, |node, matched| {
            let mut any = false;
            for (h, t) in held.iter_mut().zip(tenants) {
                if self.nodes[node].tenants.contains_key(t) {
                    *h = matched;
                    any = true;
                }
            }
            any
        });
        (held, chars)
    }

    /// Removes `tenant` from `node`; prunes nodes left without tenants and children.
    fn drop_tenant_at(&mut self, node: usize, tenant: &str) {
        let n = &mut self.nodes[node];
        if n.tenants.remove(tenant).is_some() {
            let chars = n.chars;
            if let Some(c) = self.tenant_chars.get_mut(tenant) {
                *c = c.saturating_sub(chars);
            }
        }
        let mut cur = node;
        while cur != ROOT
            && self.nodes[cur].tenants.is_empty()
            && self.nodes[cur].children.is_empty()
        {
            let parent = self.nodes[cur].parent;
            let first = self.nodes[cur].text.chars().next();
            if let Some(f) = first {
                self.nodes[parent].children.remove(&f);
            }
            self.nodes[cur] = Node::default();
            self.free.push(cur);
            cur = parent;
        }
    }

    /// Whether `node` carries `tenant` and none of its children do.
    fn is_tenant_leaf(&self, node: usize, tenant: &str) -> bool {
        let n = &self.nodes[node];
        node != ROOT
            && n.tenants.contains_key(tenant)
            && !n
                .children
                .values()
                .any(|c| self.nodes[*c].tenants.contains_key(tenant))
    }

    /// Drops each tenant's least recently used leaves until it holds at most `max_chars`.
    pub fn evict_by_size(&mut self, max_chars: usize) {
        let over: Vec<Tenant> = self
            .tenant_chars
            .iter()
            .filter(|(_, c)| **c > max_chars)
            .map(|(t, _)| t.clone())
            .collect();
        for tenant in over {
            // Min-heap by last use (Reverse through negation of the order).
            let mut heap: BinaryHeap<std::cmp::Reverse<(u64, usize)>> = (1..self.nodes.len())
                .filter(|&i| self.is_tenant_leaf(i, &tenant))
                .map(|i| std::cmp::Reverse((self.nodes[i].tenants[&tenant], i)))
                .collect();
            while self.tenant_chars(&tenant) > max_chars {
                let Some(std::cmp::Reverse((_, node))) = heap.pop() else {
                    break;
                };
                if !self.is_tenant_leaf(node, &tenant) {
                    continue;
                }
                let parent = self.nodes[node].parent;
                self.drop_tenant_at(node, &tenant);
                if self.is_tenant_leaf(parent, &tenant) {
                    let t = self.nodes[parent].tenants[&tenant];
                    heap.push(std::cmp::Reverse((t, parent)));
                }
            }
            if self.tenant_chars(&tenant) == 0 {
                self.tenant_chars.remove(&tenant);
            }
        }
    }

    /// Forgets a worker everywhere (it was removed or is unhealthy).
    pub fn remove_tenant(&mut self, tenant: &str) {
        let nodes: Vec<usize> = (1..self.nodes.len())
            .filter(|&i| self.nodes[i].tenants.contains_key(tenant))
            .collect();
        // Deepest first, so that pruning walks up through nodes already emptied.
        let mut nodes = nodes;
        nodes.sort_by_key(|&i| std::cmp::Reverse(self.depth(i)));
        for n in nodes {
            if self.nodes[n].tenants.contains_key(tenant) {
                self.drop_tenant_at(n, tenant);
            }
        }
        self.tenant_chars.remove(tenant);
    }

    fn depth(&self, mut node: usize) -> usize {
        let mut d = 0;
        while node != ROOT {
            node = self.nodes[node].parent;
            d += 1;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a list of every text inserted: the match is the longest prefix any of them
    /// shares with the query, and each worker's the longest of those sent to it, in
    /// characters, whatever the splits (multibyte text included).
    #[test]
    fn matches_agree_with_a_plain_list_of_what_was_inserted() {
        let mut rng = fastrand::Rng::with_seed(44);
        let alphabet = ['a', 'b', 'é', 'è', '中', ' '];
        let text = |rng: &mut fastrand::Rng| -> String {
            (0..rng.usize(0..24))
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect()
        };
        let mut tree = Tree::new();
        let mut sent: Vec<(String, usize)> = Vec::new();
        let workers = [t("w0"), t("w1"), t("w2")];
        let shared =
            |s: &str, q: &str| s.chars().zip(q.chars()).take_while(|(a, b)| a == b).count();
        for _ in 0..400 {
            let q = text(&mut rng);
            let want = sent.iter().map(|(s, _)| shared(s, &q)).max().unwrap_or(0);
            let m = tree.prefix_match(&q);
            assert_eq!(m.matched_chars, want, "{q:?} against {} texts", sent.len());
            assert_eq!(m.input_chars, q.chars().count());
            // Each worker's own longest prefix, as the texts sent to it say.
            let (held, chars) = tree.held_by(&q, &workers);
            assert_eq!(chars, q.chars().count());
            for (w, h) in held.iter().enumerate() {
                let want = sent
                    .iter()
                    .filter(|(_, to)| *to == w)
                    .map(|(s, _)| shared(s, &q))
                    .max()
                    .unwrap_or(0);
                assert_eq!(*h, want, "{q:?}: worker {w}");
            }
            if !q.is_empty() {
                let w = rng.usize(..workers.len());
                tree.insert(&q, &workers[w]);
                sent.push((q, w));
            }
        }
    }

    #[test]
    fn common_prefixes_count_whole_characters_only() {
        assert_eq!(common_prefix("héllo wörld", "héllo wxrld"), (7, 8));
        // é and è share their first byte: no character in common.
        assert_eq!(common_prefix("é", "è"), (0, 0));
        let long = "x".repeat(40) + "ü";
        assert_eq!(common_prefix(&long, &(long.clone() + "z")), (41, 42));
        assert_eq!(common_prefix("", "abc"), (0, 0));
        assert_eq!(common_prefix("abc", "abd"), (2, 2));
        // Past whole blocks of 32 bytes, and a character straddling a block's end.
        let a = "a".repeat(70);
        assert_eq!(
            common_prefix(&(a.clone() + "éx"), &(a.clone() + "è")),
            (70, 70)
        );
        let b = "b".repeat(31);
        assert_eq!(
            common_prefix(&(b.clone() + "éz"), &(b.clone() + "éy")),
            (32, 33)
        );
        assert_eq!(
            common_prefix(&(b.clone() + "é"), &(b.clone() + "è")),
            (31, 31)
        );
        let long = "中".repeat(3000);
        assert_eq!(common_prefix(&long, &long), (3000, 9000));
    }

    fn t(s: &str) -> Tenant {
        Arc::from(s)
    }

    #[test]
    fn the_longest_prefix_names_its_worker() {
        let mut tree = Tree::new();
        let (a, b) = (t("http://a"), t("http://b"));
        tree.insert("hello world", &a);
        tree.insert("hello there", &b);
        let m = tree.prefix_match("hello world, again");
        assert_eq!(m.tenant.as_deref(), Some("http://a"));
        assert_eq!(m.matched_chars, 11);
        assert_eq!(m.input_chars, 18);
        let m = tree.prefix_match("hello th");
        assert_eq!(m.tenant.as_deref(), Some("http://b"));
        assert_eq!(m.matched_chars, 8);
        // A partial match of a shared node: both workers hold "hello "; the most recent wins.
        let m = tree.prefix_match("hello x");
        assert_eq!(m.matched_chars, 6);
        assert_eq!(m.tenant.as_deref(), Some("http://b"));
        assert_eq!(tree.prefix_match("zzz").matched_chars, 0);
        assert_eq!(tree.prefix_match("").rate(), 0.0);
        // Char counts: a holds "hello world" (11), b holds "hello there" (11).
        assert_eq!(tree.tenant_chars("http://a"), 11);
        assert_eq!(tree.tenant_chars("http://b"), 11);
    }

    #[test]
    fn multibyte_text_splits_on_character_boundaries() {
        let mut tree = Tree::new();
        let a = t("a");
        tree.insert("héllo wörld", &a);
        tree.insert("héllo wäld", &a);
        let m = tree.prefix_match("héllo wö");
        assert_eq!(m.matched_chars, 8);
        assert_eq!(m.input_chars, 8);
        assert_eq!(tree.tenant_chars("a"), "héllo wörld".chars().count() + 3);
    }

    #[test]
    fn eviction_drops_least_recently_used_leaves_per_worker() {
        let mut tree = Tree::new();
        let (a, b) = (t("a"), t("b"));
        tree.insert("aaaa-old", &a);
        tree.insert("bb-kept", &b);
        tree.insert("aaaa-new", &a);
        // a holds "aaaa-" + "old" + "new" = 11 chars; allow 8.
        tree.evict_by_size(8);
        assert_eq!(tree.tenant_chars("a"), 8);
        assert_eq!(tree.prefix_match("aaaa-new").matched_chars, 8);
        assert_eq!(
            tree.prefix_match("aaaa-old").matched_chars,
            5,
            "old leaf gone"
        );
        assert_eq!(tree.tenant_chars("b"), 7, "b is under budget, untouched");
        tree.evict_by_size(0);
        assert_eq!(tree.node_count(), 0, "everything pruned");
    }

    #[test]
    fn removing_a_worker_prunes_its_nodes_only() {
        let mut tree = Tree::new();
        let (a, b) = (t("a"), t("b"));
        tree.insert("shared prefix one", &a);
        tree.insert("shared prefix two", &b);
        tree.remove_tenant("a");
        assert_eq!(tree.tenant_chars("a"), 0);
        let m = tree.prefix_match("shared prefix one");
        assert_eq!(m.tenant.as_deref(), Some("b"));
        assert_eq!(m.matched_chars, "shared prefix ".len());
        // Bounded random workload: counts stay consistent with a recount.
        let mut rng = fastrand::Rng::with_seed(7);
        let workers: Vec<Tenant> = (0..4).map(|i| t(&format!("w{i}"))).collect();
        for _ in 0..2000 {
            let len = rng.usize(1..40);
            let text: String = (0..len)
                .map(|_| rng.choice(['a', 'b', 'c']).unwrap())
                .collect();
            tree.insert(&text, &workers[rng.usize(..4)]);
            if rng.u8(..) < 8 {
                tree.evict_by_size(200);
            }
        }
        tree.evict_by_size(200);
        for w in &workers {
            let recount: usize = tree.nodes[1..]
                .iter()
                .filter(|n| n.tenants.contains_key(w))
                .map(|n| n.chars)
                .sum();
            assert_eq!(tree.tenant_chars(w), recount, "{w}");
            assert!(recount <= 200);
        }
    }
}
