//! The messages around the payload, as SGLang's and vLLM's ZMQ publishers send them: a live
//! message is the multipart `[topic, sequence, payload]`, the sequence 8 bytes big-endian,
//! counting from 0 per publisher. A subscriber that sees a gap asks the replay (ROUTER)
//! socket with one frame, the first sequence it wants (8 bytes big-endian, after the empty
//! delimiter a REQ or DEALER socket adds); the answer is every buffered message from there, in
//! the live form, then the end marker `["", -1 as 8 signed bytes, ""]`.

/// One published message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub topic: Vec<u8>,
    pub seq: u64,
    /// A msgpack `KvEventBatch`.
    pub payload: Vec<u8>,
}

/// The sequence frame of the replay's end marker.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Why frames are not a message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("a KV event message is [topic, sequence, payload]; got {0} frames")]
    Frames(usize),
    #[error("the sequence frame is {0} bytes, not 8")]
    Sequence(usize),
}

impl Message {
    /// The frames to send: topic, sequence, payload.
    pub fn frames(&self) -> [Vec<u8>; 3] {
        [
            self.topic.clone(),
            seq_bytes(self.seq).to_vec(),
            self.payload.clone(),
        ]
    }

    /// A message from received frames; `Ok(None)` for the replay's end marker.
    pub fn from_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<Option<Message>, WireError> {
        let [topic, seq, payload] = frames else {
            return Err(WireError::Frames(frames.len()));
        };
        let seq: [u8; 8] = seq
            .as_ref()
            .try_into()
            .map_err(|_| WireError::Sequence(seq.as_ref().len()))?;
        if seq == END_SEQ {
            return Ok(None);
        }
        Ok(Some(Message {
            topic: topic.as_ref().to_vec(),
            seq: u64::from_be_bytes(seq),
            payload: payload.as_ref().to_vec(),
        }))
    }
}

/// A sequence number as its frame.
pub fn seq_bytes(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The sequence a replay request asks from (its last frame).
pub fn replay_start(frame: &[u8]) -> Result<u64, WireError> {
    let b: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::Sequence(frame.len()))?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_the_end_marker_read_back() {
        let frames: Vec<Vec<u8>> = vec![b"kv".to_vec(), seq_bytes(258).to_vec(), vec![0x90]];
        let m = Message::from_frames(&frames).unwrap().unwrap();
        assert_eq!(m.frames().to_vec(), frames);
        assert_eq!(
            (m.topic.as_slice(), m.seq, m.payload.as_slice()),
            (&b"kv"[..], 258, &[0x90u8][..])
        );
        assert_eq!(seq_bytes(258), [0, 0, 0, 0, 0, 0, 1, 2]);
        let end: Vec<&[u8]> = vec![b"", &END_SEQ, b""];
        assert_eq!(Message::from_frames(&end), Ok(None));
        assert_eq!(END_SEQ, [0xff; 8]);
        assert_eq!(Message::from_frames(&[b"x"]), Err(WireError::Frames(1)));
        let short: Vec<&[u8]> = vec![b"", b"\x01", b""];
        assert_eq!(Message::from_frames(&short), Err(WireError::Sequence(1)));
        assert_eq!(replay_start(&seq_bytes(7)), Ok(7));
    }
}
