//! The Responses API's stored records, answered by the gateway from its history store:
//! `GET`/`DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, and the
//! Conversations API (`/v1/conversations…`). Decided from the head; the ids are read from
//! the path again where the request is served (src/serve/history.rs).

use crate::http::head::Method;

/// What a history route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryOp {
    GetResponse,
    DeleteResponse,
    ListInputItems,
    CreateConversation,
    GetConversation,
    UpdateConversation,
    DeleteConversation,
    ListItems,
    CreateItems,
    GetItem,
    DeleteItem,
}

pub const RESPONSES: &str = "/v1/responses";
pub const CONVERSATIONS: &str = "/v1/conversations";

/// The ids in a history path: `/v1/responses/{a}[/input_items]`,
/// `/v1/conversations[/{a}[/items[/{b}]]]`.
pub fn ids(path: &[u8]) -> (Option<&str>, Option<&str>) {
    let rest = path
        .strip_prefix(b"/v1/responses/")
        .or_else(|| path.strip_prefix(b"/v1/conversations/"))
        .and_then(|r| std::str::from_utf8(r).ok());
    let Some(rest) = rest else { return (None, None) };
    let mut parts = rest.split('/');
    let a = parts.next().filter(|s| !s.is_empty());
    let b = match (parts.next(), parts.next()) {
        (Some("items"), Some(item)) if !item.is_empty() => Some(item),
        _ => None,
    };
    (a, b)
}

/// The route of a history path: its operation (None: the path is one, the method is not)
/// and its metrics label; None when the path is not a history route.
pub fn classify(method: Method, path: &[u8]) -> Option<(Option<HistoryOp>, &'static str)> {
    use HistoryOp::*;
    if path == CONVERSATIONS.as_bytes() {
        return Some(((method == Method::Post).then_some(CreateConversation), CONVERSATIONS));
    }
    let one_of = |ops: &[(Method, HistoryOp)]| ops.iter().find(|(m, _)| *m == method).map(|(_, op)| *op);
    if let Some(rest) = path.strip_prefix(b"/v1/responses/") {
        let segs: Vec<&[u8]> = rest.split(|b| *b == b'/').collect();
        return match segs.as_slice() {
            [id] if !id.is_empty() => Some((
                one_of(&[(Method::Get, GetResponse), (Method::Delete, DeleteResponse)]),
                "/v1/responses/{response_id}",
            )),
            [id, b"input_items"] if !id.is_empty() => {
                Some((one_of(&[(Method::Get, ListInputItems)]), "/v1/responses/{response_id}/input_items"))
            }
            _ => None,
        };
    }
    let rest = path.strip_prefix(b"/v1/conversations/")?;
    let segs: Vec<&[u8]> = rest.split(|b| *b == b'/').collect();
    match segs.as_slice() {
        [id] if !id.is_empty() => Some((
            one_of(&[
                (Method::Get, GetConversation),
                (Method::Post, UpdateConversation),
                (Method::Delete, DeleteConversation),
            ]),
            "/v1/conversations/{conversation_id}",
        )),
        [id, b"items"] if !id.is_empty() => Some((
            one_of(&[(Method::Get, ListItems), (Method::Post, CreateItems)]),
            "/v1/conversations/{conversation_id}/items",
        )),
        [id, b"items", item] if !id.is_empty() && !item.is_empty() => Some((
            one_of(&[(Method::Get, GetItem), (Method::Delete, DeleteItem)]),
            "/v1/conversations/{conversation_id}/items/{item_id}",
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods() {
        let op = |m: Method, p: &str| classify(m, p.as_bytes()).map(|(op, _)| op);
        assert_eq!(op(Method::Get, "/v1/responses/resp_1"), Some(Some(HistoryOp::GetResponse)));
        assert_eq!(op(Method::Delete, "/v1/responses/resp_1"), Some(Some(HistoryOp::DeleteResponse)));
        assert_eq!(op(Method::Post, "/v1/responses/resp_1"), Some(None));
        assert_eq!(op(Method::Get, "/v1/responses/resp_1/input_items"), Some(Some(HistoryOp::ListInputItems)));
        assert_eq!(op(Method::Get, "/v1/responses/"), None);
        assert_eq!(op(Method::Post, "/v1/conversations"), Some(Some(HistoryOp::CreateConversation)));
        assert_eq!(op(Method::Post, "/v1/conversations/conv_1"), Some(Some(HistoryOp::UpdateConversation)));
        assert_eq!(op(Method::Post, "/v1/conversations/conv_1/items"), Some(Some(HistoryOp::CreateItems)));
        assert_eq!(op(Method::Delete, "/v1/conversations/conv_1/items/msg_1"), Some(Some(HistoryOp::DeleteItem)));
        assert_eq!(op(Method::Get, "/v1/conversations/conv_1/nope"), None);
        assert_eq!(ids(b"/v1/conversations/conv_1/items/msg_2"), (Some("conv_1"), Some("msg_2")));
        assert_eq!(ids(b"/v1/responses/resp_1/input_items"), (Some("resp_1"), None));
    }
}
