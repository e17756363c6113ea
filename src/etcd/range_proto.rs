//! etcd's Range messages in protobuf, for the list over gRPC (`grpc.rs`):
//! written by hand with prost's derive, only the fields a list uses (prost
//! skips the others in a reply), the field numbers those of etcd's
//! `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto` (3.4 and later:
//! these have not changed since v3's first release). No `protoc`, no build
//! script.

use prost::bytes::Bytes;

/// `etcdserverpb.RangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub(super) key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(super) range_end: Vec<u8>,
    /// Keys sent at most (0: every key of the range).
    #[prost(int64, tag = "3")]
    pub(super) limit: i64,
    /// The revision read at (0: the store's revision now).
    #[prost(int64, tag = "4")]
    pub(super) revision: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub(super) header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub(super) kvs: Vec<RawKeyValue>,
    /// Whether keys are left in the range after those sent.
    #[prost(bool, tag = "3")]
    pub(super) more: bool,
    /// The keys in the range (not only those sent).
    #[prost(int64, tag = "4")]
    pub(super) count: i64,
}

/// `etcdserverpb.ResponseHeader`: what `history.rs` compares.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub(super) struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub(super) cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub(super) member_id: u64,
    #[prost(int64, tag = "3")]
    pub(super) revision: i64,
    #[prost(uint64, tag = "4")]
    pub(super) raft_term: u64,
}

/// A key as it stands in etcd, its key as bytes (which need not be UTF-8):
/// `mvccpb.KeyValue` without its `version` and `lease`, so a list's reply
/// decodes straight into the keys the source keeps.
///
/// Its key and value are `Bytes`: a page's decode slices them out of the
/// reply's one buffer instead of allocating two small chunks a key, which
/// outlived the list as holes in the heap (resident memory the process
/// kept, about 50 B a key at a million) and cost a malloc and a free each.
/// So whoever keeps a key past its page copies it (the fingerprint's
/// witnesses do): a slice kept holds the whole page's buffer.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct RawKeyValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) key: Bytes,
    /// 0 in a delete's.
    #[prost(int64, tag = "2")]
    pub(crate) create_revision: i64,
    #[prost(int64, tag = "3")]
    pub(crate) mod_revision: i64,
    #[prost(bytes = "bytes", tag = "5")]
    pub(crate) value: Bytes,
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// A reply as etcd encodes it, fields reconq does not read included
    /// (a key's `version` and `lease`), decodes to the fields it does.
    #[test]
    fn a_reply_decodes_by_etcd_s_field_numbers() {
        // RangeResponse{header{cluster_id 7, member_id 8, revision 9, raft_term 3},
        //   kvs[{key "/p/a", create_revision 4, mod_revision 5, version 2, value "v", lease 6}],
        //   more true, count 12}, encoded by hand from rpc.proto's numbers.
        let header = [0x08, 7, 0x10, 8, 0x18, 9, 0x20, 3];
        let kv = [&[0x0a, 4][..], b"/p/a", &[0x10, 4, 0x18, 5, 0x20, 2, 0x2a, 1, b'v', 0x30, 6]].concat();
        let reply =
            [&[0x0a, header.len() as u8][..], &header, &[0x12, kv.len() as u8], &kv, &[0x18, 1, 0x20, 12]].concat();
        let decoded = RangeResponse::decode(&reply[..]).unwrap();
        let kv = RawKeyValue { key: b"/p/a"[..].into(), create_revision: 4, mod_revision: 5, value: b"v"[..].into() };
        let header = ResponseHeader { cluster_id: 7, member_id: 8, revision: 9, raft_term: 3 };
        assert_eq!(decoded, RangeResponse { header: Some(header), kvs: vec![kv], more: true, count: 12 });
    }

    #[test]
    fn a_request_encodes_by_etcd_s_field_numbers() {
        let request = RangeRequest { key: b"/p/".to_vec(), range_end: b"/p0".to_vec(), limit: 10, revision: 0 };
        let expected = [&[0x0a, 3][..], b"/p/", &[0x12, 3], b"/p0", &[0x18, 10]].concat();
        assert_eq!(request.encode_to_vec(), expected, "zeros are left out");
    }
}
