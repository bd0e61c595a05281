//! The multi-turn workload, as SGLang's `bench_multiturn.py` builds it: per client a first
//! prompt and the sub-questions of its later rounds (token ids), output lengths, a round count,
//! and the sender's arrival process and ready-queue order. Pure and seeded: the same options
//! give the same workload.

use crate::simulated_tokens::VOCAB;
use std::time::Duration;

/// How requests are spread in time (`--distribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Exponential gaps (expovariate(rate)).
    Poisson,
    /// Gaps uniform in [0, 2/rate].
    Uniform,
}

/// Which conversation's next round goes first (`--ready-queue-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueuePolicy {
    Random,
    Fifo,
}

/// What shapes the workload.
#[derive(Debug, Clone)]
pub struct Shape {
    pub num_clients: usize,
    pub request_length: usize,
    /// Tokens of each later round's question (0 = `request_length`).
    pub sub_question_length: usize,
    pub output_length: usize,
    pub num_rounds: usize,
    /// Per-client rounds drawn in [min, max] when both are set (0 = `num_rounds`).
    pub min_rounds: usize,
    pub max_rounds: usize,
    pub range_ratio: f64,
    /// Synthetic ids `(offset + i + j) % vocab` instead of random ones.
    pub deterministic_ids: bool,
    pub seed: u64,
    /// A skewed workload: this many of the clients (the first ones) open with a long prompt
    /// instead ...
    pub long_clients: usize,
    /// ... of this many tokens ...
    pub long_request_length: usize,
    /// ... whose first tokens, this many, are the same for all of them (a shared document).
    pub long_shared_prefix: usize,
}

/// One client's conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// `questions[0]` is the first prompt; later ones are appended after each answer.
    pub questions: Vec<Vec<u32>>,
    /// Tokens to generate per round.
    pub output_lengths: Vec<usize>,
}

impl Conversation {
    /// How many questions the conversation asks.
    pub fn rounds(&self) -> usize {
        self.questions.len()
    }
}

/// A length drawn as `randint(max(int(L * ratio), 1), L + 1)` (inclusive of L).
pub fn length(rng: &mut fastrand::Rng, l: usize, ratio: f64) -> usize {
    let lo = ((l as f64 * ratio) as usize).max(1);
    let hi = l.max(lo);
    rng.usize(lo..=hi)
}

fn ids(rng: &mut fastrand::Rng, n: usize, deterministic: bool, offset: usize) -> Vec<u32> {
    if deterministic {
        (0..n)
            .map(|j| ((offset + j) % VOCAB as usize) as u32)
            .collect()
    } else {
        (0..n).map(|_| rng.u32(0..VOCAB)).collect()
    }
}

/// The conversations of a workload of shape `s`, the same for the same seed.
pub fn conversations(s: &Shape) -> Vec<Conversation> {
    let mut rng = fastrand::Rng::with_seed(s.seed);
    let sub_len = if s.sub_question_length == 0 {
        s.request_length
    } else {
        s.sub_question_length
    };
    let mut offset = 0usize;
    let shared_head = ids(
        &mut fastrand::Rng::with_seed(s.seed ^ 0x5eed_5ba7_ed00),
        s.long_shared_prefix.min(s.long_request_length),
        s.deterministic_ids,
        VOCAB as usize / 2,
    );
    (0..s.num_clients)
        .map(|i| {
            let rounds = if s.min_rounds > 0 && s.max_rounds >= s.min_rounds {
                rng.usize(s.min_rounds..=s.max_rounds)
            } else {
                s.num_rounds.max(1)
            };
            let mut questions = Vec::with_capacity(rounds);
            let mut output_lengths = Vec::with_capacity(rounds);
            for r in 0..rounds {
                if r == 0 && i < s.long_clients {
                    let own = s.long_request_length - shared_head.len();
                    let mut q = shared_head.clone();
                    q.extend(ids(&mut rng, own, s.deterministic_ids, offset + i));
                    offset += own;
                    questions.push(q);
                    output_lengths.push(length(&mut rng, s.output_length, s.range_ratio));
                    continue;
                }
                let base = if r == 0 { s.request_length } else { sub_len };
                let n = length(&mut rng, base, s.range_ratio);
                questions.push(ids(&mut rng, n, s.deterministic_ids, offset + i));
                offset += n;
                output_lengths.push(length(&mut rng, s.output_length, s.range_ratio));
            }
            Conversation {
                questions,
                output_lengths,
            }
        })
        .collect()
}

/// The sender's gaps between requests.
pub struct Arrivals {
    rng: fastrand::Rng,
    rate: f64,
    dist: Distribution,
}

impl Arrivals {
    /// Arrivals at `rate` requests per second spaced by `dist`, drawn from `seed`.
    pub fn new(rate: f64, dist: Distribution, seed: u64) -> Arrivals {
        Arrivals {
            rng: fastrand::Rng::with_seed(seed ^ 0x5eed),
            rate,
            dist,
        }
    }

    /// The next gap; zero for an infinite rate.
    pub fn next_gap(&mut self) -> Duration {
        if !self.rate.is_finite() || self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let s = match self.dist {
            // expovariate: -ln(1 - U) / rate, U in [0, 1)
            Distribution::Poisson => -(1.0 - self.rng.f64()).ln() / self.rate,
            Distribution::Uniform => self.rng.f64() * 2.0 / self.rate,
        };
        Duration::from_secs_f64(s)
    }
}

/// Ready requests (client indices) in the order the policy pops them.
pub struct ReadyQueue {
    items: Vec<usize>,
    policy: QueuePolicy,
    rng: fastrand::Rng,
}

impl ReadyQueue {
    /// An empty queue of clients ready to send, taken in `policy`'s order (random ones drawn
    /// from `seed`).
    pub fn new(policy: QueuePolicy, seed: u64) -> ReadyQueue {
        ReadyQueue {
            items: Vec::new(),
            policy,
            rng: fastrand::Rng::with_seed(seed ^ 0x9e37),
        }
    }

    /// A client is ready to send its next turn.
    pub fn push(&mut self, client: usize) {
        self.items.push(client);
    }

    /// The next client to send, in the queue's order.
    pub fn pop(&mut self) -> Option<usize> {
        if self.items.is_empty() {
            return None;
        }
        Some(match self.policy {
            QueuePolicy::Fifo => self.items.remove(0),
            QueuePolicy::Random => {
                let i = self.rng.usize(..self.items.len());
                self.items.swap_remove(i)
            }
        })
    }

    /// Clients ready to send.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no client is ready.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            num_clients: 20,
            request_length: 100,
            sub_question_length: 10,
            output_length: 8,
            num_rounds: 3,
            min_rounds: 0,
            max_rounds: 0,
            range_ratio: 1.0,
            deterministic_ids: false,
            seed: 1,
            long_clients: 0,
            long_request_length: 0,
            long_shared_prefix: 0,
        }
    }

    #[test]
    fn a_skewed_workload_opens_a_few_conversations_with_long_prompts_sharing_a_head() {
        let mut s = shape();
        s.long_clients = 3;
        s.long_request_length = 1000;
        s.long_shared_prefix = 600;
        let c = conversations(&s);
        for (i, conv) in c.iter().enumerate() {
            let first = &conv.questions[0];
            if i < 3 {
                assert_eq!(first.len(), 1000);
                assert_eq!(first[..600], c[0].questions[0][..600], "client {i}");
                assert_ne!(
                    first[600..],
                    c[(i + 1) % 3].questions[0][600..],
                    "client {i}"
                );
            } else {
                assert_eq!(first.len(), 100, "client {i}");
            }
            assert_eq!(conv.questions[1].len(), 10, "later rounds as usual");
        }
        assert_eq!(conversations(&s), c, "seeded");
    }

    #[test]
    fn lengths_follow_the_range_ratio() {
        let c = conversations(&shape());
        assert_eq!(c.len(), 20);
        for conv in &c {
            assert_eq!(conv.rounds(), 3);
            assert_eq!(conv.questions[0].len(), 100, "ratio 1.0: exactly L");
            assert_eq!(conv.questions[1].len(), 10, "sub-questions");
            assert_eq!(conv.output_lengths, vec![8, 8, 8]);
        }
        let mut s = shape();
        s.range_ratio = 0.5;
        s.min_rounds = 2;
        s.max_rounds = 5;
        let c = conversations(&s);
        let firsts: Vec<usize> = c.iter().map(|c| c.questions[0].len()).collect();
        assert!(firsts.iter().all(|&n| (50..=100).contains(&n)));
        assert!(firsts.iter().any(|&n| n != 100), "lengths vary");
        assert!(c.iter().all(|c| (2..=5).contains(&c.rounds())));
        assert!(c.iter().any(|c| c.rounds() != c.rounds().min(2)));
        assert_eq!(conversations(&s), c, "seeded");
        s.seed = 2;
        assert_ne!(conversations(&s), c);
        let mut rng = fastrand::Rng::with_seed(3);
        assert_eq!(length(&mut rng, 0, 1.0), 1, "never empty");
    }

    #[test]
    fn deterministic_ids_follow_the_formula() {
        let mut s = shape();
        s.deterministic_ids = true;
        s.num_clients = 2;
        let c = conversations(&s);
        assert_eq!(&c[0].questions[0][..3], &[0, 1, 2]);
        assert!(c
            .iter()
            .flat_map(|c| c.questions.iter().flatten())
            .all(|&t| t < VOCAB));
    }

    #[test]
    fn arrivals_have_the_asked_mean() {
        for dist in [Distribution::Poisson, Distribution::Uniform] {
            let mut a = Arrivals::new(4.0, dist, 7);
            let n = 20_000;
            let mean: f64 = (0..n).map(|_| a.next_gap().as_secs_f64()).sum::<f64>() / n as f64;
            assert!((mean - 0.25).abs() < 0.01, "{dist:?}: mean gap {mean}");
        }
        let mut u = Arrivals::new(4.0, Distribution::Uniform, 7);
        assert!((0..1000).all(|_| u.next_gap() <= Duration::from_millis(500)));
        let mut inf = Arrivals::new(f64::INFINITY, Distribution::Poisson, 7);
        assert_eq!(inf.next_gap(), Duration::ZERO);
    }

    #[test]
    fn ready_queue_orders() {
        let mut q = ReadyQueue::new(QueuePolicy::Fifo, 1);
        for i in 0..5 {
            q.push(i);
        }
        assert_eq!(
            (0..5).map(|_| q.pop().unwrap()).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(q.pop(), None);
        let mut q = ReadyQueue::new(QueuePolicy::Random, 1);
        for i in 0..50 {
            q.push(i);
        }
        let order: Vec<usize> = (0..50).map(|_| q.pop().unwrap()).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>(), "each once");
        assert_ne!(order, sorted, "not in order");
    }
}
